"""ProcessGrid: the world's ranks laid out on a dp × pp × tp (× cp × ep) grid, and the
process groups of each axis.

Combining parallelisms ("3D parallelism": Narayanan et al. 2021, "Efficient Large-Scale
Language Model Training on GPU Clusters Using Megatron-LM", Sec. 2.3 and 3) means every
rank has a coordinate on three axes and talks to different ranks on each:

    tp   tensor parallel: the ranks that split one layer's matmuls (all-reduce every layer)
    pp   pipeline parallel: the ranks that hold consecutive stages (send/recv activations)
    dp   data parallel: the ranks that hold the same shard of the model (all-reduce grads)
    cp   context parallel: the ranks that split one sequence (ring attention or Ulysses,
         ddnb.context_parallel: K/V blocks around the ring, or all-to-alls)
    ep   expert parallel: the ranks that split a mixture-of-experts layer's experts
         (ddnb.expert_parallel: tokens dispatched and combined by all-to-all)

Axis order (the same as Megatron-LM's default and torchtitan's mesh ["pp", "dp", "tp"];
Megatron-core puts cp and ep between, "tp-cp-ep-dp-pp"): tp varies fastest, then cp, ep,
dp, and pp slowest,

    rank = (((pp_rank · dp + dp_rank) · ep + ep_rank) · cp + cp_rank) · tp + tp_rank

(with cp = ep = 1, the default: rank = pp_rank · (dp · tp) + dp_rank · tp + tp_rank)

so the t ranks of a tensor-parallel group are consecutive (on one machine, where the
bandwidth is highest: tp communicates the most, Narayanan et al. 2021, Sec. 3.3,
"Takeaway #1"). With dp=2, tp=2 on 4 ranks: tp groups [0, 1], [2, 3]; dp groups
[0, 2], [1, 3].

    grid = ProcessGrid(dp=2, tp=2)                # on every rank, at the same point
    grid.coords()                                 # Coords(dp=1, pp=0, tp=0) on rank 2
    grid.ranks("tp")                              # [2, 3]: my tp group, global ranks
    grid.group("dp")                              # the torch.distributed group of [0, 2]

The groups are made with dist.new_group, which every rank must call for every group in
the same order (or some rank blocks): the constructor makes all of them, axis by axis,
on every rank, and keeps the ones this rank belongs to. Nothing is global: pass the grid
(or its groups) to what needs it. Without torch.distributed (or with world_size and rank
given) it is pure arithmetic. Taught in `notebooks/10_tensor_parallelism.ipynb`.
"""
from __future__ import annotations

from typing import NamedTuple

import torch.distributed as dist

from ddnb._checks import Checks, is_int

AXES = ("dp", "pp", "tp", "cp", "ep")
ORDER = ("pp", "dp", "ep", "cp", "tp")   # slowest to fastest


def _check_rank(rank, world_size: int) -> None:
    if not (is_int(rank) and 0 <= rank < world_size):
        raise ValueError(f"rank({rank!r}) is not in [0, world_size({world_size})): a rank is an int")


class Coords(NamedTuple):
    dp: int
    pp: int
    tp: int
    cp: int = 0
    ep: int = 0


class ProcessGrid:
    """dp · pp · tp · cp · ep ranks on a grid (tp fastest-varying, pp slowest) and their groups.

    world_size / rank default to torch.distributed's; the groups are built (on every
    rank, in the same order) only when torch.distributed is initialized and
    `build_groups` is True, each by `new_group(ranks)` (default dist.new_group; a
    program that builds grid after grid in one world can pass one that reuses the groups
    of the same ranks: torch never frees a gloo group's threads)."""

    def __init__(self, dp: int = 1, pp: int = 1, tp: int = 1, world_size: int | None = None,
                 rank: int | None = None, build_groups: bool = True, cp: int = 1, ep: int = 1,
                 new_group=None):
        sizes = {"dp": dp, "pp": pp, "tp": tp, "cp": cp, "ep": ep}
        initialized = dist.is_available() and dist.is_initialized()
        if world_size is None and initialized:
            world_size = dist.get_world_size()
        if rank is None:
            rank = dist.get_rank() if initialized else 0
        with Checks("ProcessGrid") as check:
            bad = [a for a, v in sizes.items() if not (is_int(v) and v >= 1)]
            shown = [a for a in AXES if a in ("dp", "pp", "tp") or sizes[a] != 1]   # cp, ep when used
            names = ", ".join(shown[:-1]) + f" and {shown[-1]}"
            factors_ok = check.rule(not bad, f"{names} must be integers >= 1, got "
                                    f"{', '.join(f'{a}={sizes[a]!r}' for a in shown)} "
                                    f"({' and '.join(bad)} {'is' if len(bad) == 1 else 'are'} not)")
            if check.rule(world_size is not None, "world_size is needed when torch.distributed is not initialized"):
                product = " * ".join(f"{a}({sizes[a]})" for a in shown)
                positions = dp * pp * tp * cp * ep if factors_ok else 0
                if check.integer("world_size", world_size, min=1) and factors_ok and check.rule(
                        positions == world_size, f"{product} != world_size({world_size}): "
                                                 f"the grid has {positions} positions for {world_size} ranks"):
                    check.rule(is_int(rank) and 0 <= rank < world_size,
                               f"rank({rank!r}) is not in [0, world_size({world_size})): a rank is an int")
        self.sizes, self.world_size, self.rank = sizes, world_size, rank
        self._groups: dict = {}
        self._new_group = dist.new_group if new_group is None else new_group
        if build_groups and initialized:
            if world_size != dist.get_world_size():
                raise ValueError(f"world_size({world_size}) differs from torch.distributed's "
                                 f"({dist.get_world_size()}): groups can only be built over the whole world")
            for axis in AXES:                               # the same calls, in the same order, on every rank
                if axis in ("cp", "ep") and sizes[axis] == 1:
                    continue                                # unused: N one-rank groups cost ~1 s each on gloo
                for ranks in self.all_ranks(axis):
                    group = self._new_group(ranks)
                    if rank in ranks:
                        self._groups[axis] = group

    @property
    def dp(self) -> int:
        return self.sizes["dp"]

    @property
    def pp(self) -> int:
        return self.sizes["pp"]

    @property
    def tp(self) -> int:
        return self.sizes["tp"]

    @property
    def cp(self) -> int:
        return self.sizes["cp"]

    @property
    def ep(self) -> int:
        return self.sizes["ep"]

    def coords(self, rank: int | None = None) -> Coords:
        """(dp, pp, tp, cp, ep) coordinates of `rank` (default: this rank)."""
        rank = self.rank if rank is None else rank
        _check_rank(rank, self.world_size)
        coords = {}
        for axis in reversed(ORDER):                     # fastest first: tp, cp, ep, dp, pp
            rank, coords[axis] = divmod(rank, self.sizes[axis])
        return Coords(**coords)

    def rank_of(self, dp: int = 0, pp: int = 0, tp: int = 0, cp: int = 0, ep: int = 0) -> int:
        """The global rank at coordinates (dp, pp, tp, cp, ep): the inverse of coords."""
        at = {"dp": dp, "pp": pp, "tp": tp, "cp": cp, "ep": ep}
        with Checks("ProcessGrid.rank_of") as check:
            for axis in AXES:
                v = at[axis]
                check.rule(is_int(v) and 0 <= v < self.sizes[axis],
                           f"{axis}={v!r} is not in [0, {axis}({self.sizes[axis]})): a coordinate is an int")
        rank = 0
        for axis in ORDER:                               # slowest first
            rank = rank * self.sizes[axis] + at[axis]
        return rank

    def ranks(self, axis: str, rank: int | None = None) -> list[int]:
        """The global ranks of `rank`'s group along `axis` (the others fixed), in order."""
        c = self.coords(rank)._asdict()
        self._check_axis(axis)
        return [self.rank_of(**{**c, axis: i}) for i in range(self.sizes[axis])]

    def all_ranks(self, axis: str) -> list[list[int]]:
        """Every group along `axis`, each a list of global ranks, ordered by their first rank."""
        self._check_axis(axis)
        groups = {tuple(self.ranks(axis, r)) for r in range(self.world_size)}
        return [list(g) for g in sorted(groups)]

    def group(self, axis: str):
        """This rank's torch.distributed process group along `axis`."""
        self._check_axis(axis)
        if axis in ("cp", "ep") and self.sizes[axis] == 1 and self._groups:
            raise RuntimeError(f"{axis}=1: no {axis} group is built for an unused axis (the layers take "
                               f"group=None or a one-rank group of your own)")
        if axis not in self._groups:
            raise RuntimeError("this ProcessGrid built no process groups (torch.distributed was not "
                               "initialized, or build_groups=False)")
        return self._groups[axis]

    def ranks_over(self, axes, rank: int | None = None) -> list[int]:
        """The global ranks that share `rank`'s coordinates on every axis but `axes` (a
        tuple of axes), in rank order: ranks_over(("dp", "cp")) are the ranks that hold the
        same parameters when both the batch and the sequence are split (ZeRO and the
        gradient all-reduce run over them, Megatron-core's "dp-cp" group)."""
        for axis in axes:
            self._check_axis(axis)
        c = self.coords(rank)._asdict()
        return sorted(r for r in range(self.world_size)
                      if all(v == c[a] for a, v in self.coords(r)._asdict().items() if a not in axes))

    def group_over(self, axes):
        """This rank's torch.distributed group of `ranks_over(axes)`; one axis is `group`'s.
        Several axes' groups are made on the first call, on every rank, so call it on every
        rank at the same point (dist.new_group's rule)."""
        axes = tuple(a for a in axes if self.sizes.get(a, 0) > 1) or tuple(axes)[:1]   # size-1 axes add no rank
        if len(axes) == 1:
            return self.group(axes[0])
        if axes not in self._groups:
            if not self._groups:
                self.group(axes[0])                      # says why there are no groups
            for ranks in sorted({tuple(self.ranks_over(axes, r)) for r in range(self.world_size)}):
                group = self._new_group(list(ranks))
                if self.rank in ranks:
                    self._groups[axes] = group
        return self._groups[axes]

    def _check_axis(self, axis: str) -> None:
        if axis not in AXES:
            raise ValueError(f"axis={axis!r} is not one of {AXES}")

    def __repr__(self) -> str:
        more = "".join(f", {a}={self.sizes[a]}" for a in ("cp", "ep") if self.sizes[a] != 1)
        return (f"ProcessGrid(dp={self.dp}, pp={self.pp}, tp={self.tp}{more}, world_size={self.world_size}, "
                f"rank={self.rank}: {self.coords()})")

    def table(self) -> list[dict]:
        """One row per rank: {"rank", "dp", "pp", "tp", "cp", "ep"} (for printing the layout)."""
        return [{"rank": r, **self.coords(r)._asdict()} for r in range(self.world_size)]


_REUSED: dict = {}   # per process: ranks -> its group, for grid after grid in one world


def reused_group(ranks):
    """dist.new_group(ranks) the first time this process asks for these ranks, the same
    group after: pass it as ProcessGrid(new_group=reused_group) to build grid after grid in
    one world (the capstone's layouts, its tests). torch never frees a gloo group's threads
    (destroying one keeps them), so ~5 new groups a layout on 16 ranks made every later
    layout slower (9 more threads per rank a layout). Every rank must ask for the same ranks
    in the same order, as for dist.new_group; the default group's world must not change."""
    key = tuple(ranks)
    if key not in _REUSED:
        _REUSED[key] = dist.new_group(list(ranks))
    return _REUSED[key]
