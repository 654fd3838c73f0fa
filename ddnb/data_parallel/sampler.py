"""Batch partitioning for data parallelism: each rank reads its own disjoint shard of the
dataset, reshuffled every epoch from a seed all ranks share.

With N ranks (`num_replicas`) and a dataset of n items, epoch e:

    order   = permutation(n, seed + e)              the same on every rank (shared seed)
    padding : order += order[:ceil(n/N)·N - n]       repeat the first items until N divides it
    drop_last: order  = order[:floor(n/N)·N]         or drop the last n mod N items
    shard_r = order[r :: N]                          rank r takes every N-th item from r

so every rank gets the same number of items (a step has the same batch size everywhere,
which is what makes "average of the ranks' gradients = gradient of the global batch"
true, see `naive.py`), and the union of the shards is the dataset exactly once per epoch
(plus at most N-1 repeats with padding, minus at most N-1 items with drop_last). The
layout is torch.utils.data.DistributedSampler's; `shard_indices` is it as a pure
function, so it can be checked without a cluster (tests/test_data_parallel.py).
Goyal et al. 2017 ("Accurate, large minibatch SGD", Sec. 3) explain why the shuffle
must be a single global permutation split across workers, not N local ones.
Taught in `notebooks/06_data_parallelism.ipynb`.
"""
from __future__ import annotations

import math

import torch
from torch.utils.data import Sampler

from ddnb._checks import Checks, is_int


SEEDS = (-2 ** 63, 2 ** 63)   # seed and epoch ranges whose sum torch.Generator.manual_seed takes
EPOCHS = (0, 2 ** 63)


def _validate(num_items, num_replicas, rank, seed, shuffle=True, drop_last=False, where="ShardSampler") -> None:
    """One TypeError naming every argument of the wrong type, else one ValueError naming
    every value that breaks a rule."""
    with Checks(where, TypeError) as types:
        for name, value in (("num_items", num_items), ("num_replicas", num_replicas), ("rank", rank), ("seed", seed)):
            types.rule(is_int(value), f"{name}={value!r}: need an int")
        for name, value in (("shuffle", shuffle), ("drop_last", drop_last)):
            types.rule(isinstance(value, bool), f"{name}={value!r}: need True or False")
    with Checks(where) as check:
        check.rule(SEEDS[0] <= seed < SEEDS[1], f"seed={seed} is not in [-2**63, 2**63)")
        if check.integer("num_replicas", num_replicas, min=1):
            check.rule(num_replicas <= num_items, f"num_replicas={num_replicas} > num_items={num_items}: every "
                       f"rank needs at least one item per epoch (rule: num_replicas <= len(dataset))")
            check.rule(0 <= rank < num_replicas,
                       f"rank={rank} is not in 0..{num_replicas - 1} (num_replicas={num_replicas})")


def _check_epoch(epoch, where: str = "ShardSampler") -> None:
    """TypeError if epoch is not an int, ValueError if it is outside [0, 2**63)."""
    problem = f"{where}: epoch={epoch!r}: need an int in [0, 2**63)"
    if not is_int(epoch):
        raise TypeError(problem)
    if not EPOCHS[0] <= epoch < EPOCHS[1]:
        raise ValueError(problem)


def shard_size(num_items: int, num_replicas: int, drop_last: bool = False) -> int:
    """Items per rank per epoch: ceil(n/N) with padding, floor(n/N) with drop_last."""
    return num_items // num_replicas if drop_last else math.ceil(num_items / num_replicas)


def shard_indices(num_items: int, num_replicas: int, rank: int, epoch: int = 0, seed: int = 0,
                  shuffle: bool = True, drop_last: bool = False) -> list[int]:
    """The dataset indices rank `rank` of `num_replicas` reads in `epoch` (see the module
    docstring). Pure: the same arguments give the same list on every rank."""
    _validate(num_items, num_replicas, rank, seed, shuffle, drop_last, where="shard_indices")
    _check_epoch(epoch, "shard_indices")
    if shuffle:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        order = torch.randperm(num_items, generator=g).tolist()     # (n,), one global permutation
    else:
        order = list(range(num_items))
    total = shard_size(num_items, num_replicas, drop_last) * num_replicas
    if total > num_items:
        order += order[:total - num_items]   # < N repeats, and N <= n, so order[:pad] is long enough
    else:
        order = order[:total]
    return order[rank:total:num_replicas]                            # (total / N,)


class ShardSampler(Sampler):
    """A sampler giving this rank its shard of the dataset, for a DataLoader:

        sampler = ShardSampler(dataset, num_replicas=world_size, rank=rank, seed=0)
        loader = DataLoader(dataset, batch_size=32, sampler=sampler)
        for epoch in range(epochs):
            sampler.set_epoch(epoch)      # a new shuffle each epoch, the same on every rank
            for x, y in loader: ...

    `dataset` is anything with a length (or the length itself). num_replicas and rank
    default to torch.distributed's world (size and rank in `group`)."""

    def __init__(self, dataset, num_replicas: int | None = None, rank: int | None = None, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False, group=None):
        if isinstance(dataset, int) and not isinstance(dataset, bool):
            num_items = dataset
        elif hasattr(dataset, "__len__") and not isinstance(dataset, bool):
            num_items = len(dataset)
        else:
            raise TypeError(f"ShardSampler: dataset must have a length or be the number of items (an int), "
                            f"got {dataset!r}")
        if num_replicas is None or rank is None:
            import torch.distributed as dist

            if not dist.is_initialized():
                raise ValueError("ShardSampler: pass num_replicas and rank, or initialize torch.distributed first")
            num_replicas = dist.get_world_size(group) if num_replicas is None else num_replicas
            rank = dist.get_rank(group) if rank is None else rank
        _validate(num_items, num_replicas, rank, seed, shuffle, drop_last)
        self.num_items, self.num_replicas, self.rank = num_items, num_replicas, rank
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch = 0
        self.start = 0      # items of this epoch's shard already used: where a resumed run goes on

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch's permutation (seed + epoch); call it on every rank. A new epoch
        starts at its first item; the current one (after `load_state_dict`) keeps its place."""
        _check_epoch(epoch, "ShardSampler.set_epoch")
        if epoch != self.epoch:
            self.epoch, self.start = epoch, 0

    def indices(self) -> list[int]:
        """This rank's whole shard of the current epoch (from its first item)."""
        return shard_indices(self.num_items, self.num_replicas, self.rank, self.epoch, self.seed,
                             self.shuffle, self.drop_last)

    def __iter__(self):
        return iter(self.indices()[self.start:])

    def state_dict(self) -> dict:
        """The position (epoch, start) and what fixes the shards, for a checkpoint. The
        training loop advances `start` by the items it has used."""
        return {"epoch": self.epoch, "start": self.start, "seed": self.seed, "num_items": self.num_items,
                "num_replicas": self.num_replicas, "rank": self.rank, "shuffle": self.shuffle,
                "drop_last": self.drop_last}

    def load_state_dict(self, state: dict) -> None:
        """Go on from a saved position; refused when the saved shards are not this sampler's."""
        mine = self.state_dict()
        if not isinstance(state, dict):
            raise TypeError(f"ShardSampler.load_state_dict: state must be a dict from state_dict(), got {state!r}")
        missing = [k for k in mine if k not in state]
        if missing:
            raise ValueError(f"ShardSampler.load_state_dict: the saved state lacks {', '.join(missing)}: "
                             f"not a ShardSampler.state_dict()")
        wrong = [f"{k}: saved {state.get(k)!r}, here {mine[k]!r}" for k in mine
                 if k not in ("epoch", "start") and state.get(k) != mine[k]]
        if wrong:
            raise ValueError("ShardSampler.load_state_dict: the saved position belongs to other shards (" +
                             "; ".join(wrong) + ")")
        epoch, start = state["epoch"], state["start"]
        _check_epoch(epoch, "ShardSampler.load_state_dict")
        with Checks("ShardSampler.load_state_dict") as check:
            if check.integer("start", start, min=0):
                check.rule(start <= len(self), f"start={start} is past the shard's {len(self)} items")
        self.epoch, self.start = epoch, start

    def __len__(self) -> int:
        return shard_size(self.num_items, self.num_replicas, self.drop_last)
