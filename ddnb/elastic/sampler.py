"""An elastic, resumable sampler: the world size may change in the middle of an epoch,
and every sample of the epoch is still read exactly once.

The epoch is one seeded permutation of the dataset, the same on every rank (the one
`ddnb.data_parallel.sampler.shard_indices` draws: `torch.randperm` seeded with seed + epoch).
The sampler's whole position is two numbers, the same on every rank:

    (epoch, consumed)      consumed: samples of this epoch read so far, by all ranks together

The samples not yet read are `order[consumed:]`, and rank r of M reads them strided, as
torch's DistributedSampler does (Goyal et al. 2017 read each epoch once, split over ranks):

    remaining = order[consumed:]                    (R,)   R = n - consumed
    rank r    : remaining[r::M]                     (ceil((R - r) / M),)

A step in which every rank reads b samples reads remaining[:b·M] (the union of the
strided prefixes), so after the step consumed += b·M on every rank and the next step's
remaining is again a suffix of `order`: resizing from N to M ranks between two steps
changes only the stride, never which samples are left.

The tail. When R is not a multiple of M the ranks get uneven shares: ranks r < R mod M
read one sample more (no padding: DistributedSampler repeats the first samples to make
the shares even, which reads them twice; no dropping: drop_last skips up to M - 1
samples). The last step's batches are then short, by at most one sample per rank, and a
rank may get none; a data-parallel step takes the mean over the global count
(`step_count`), not over its own batch.

Every rank keeps a record of the indices it read (`record`). `state_dict()` gathers the
records of all ranks (a collective when torch.distributed is initialized), so that the
state saved in a checkpoint holds the history of the whole epoch and a resized world
carries it on; `exactly_once` checks a record. Taught in
`notebooks/15_elastic_training.ipynb`.

    sampler = ElasticSampler(len(train), seed=0)       # the same on every rank
    idx = sampler.next_batch(rank, world_size, 16)     # this rank's 16 indices of the step
    ...                                                # forward, backward, step
    sampler.state_dict()                               # {"epoch", "consumed", "seed", ...}
"""
from __future__ import annotations

import json

from ddnb._checks import Checks, is_int
from ddnb.data_parallel.sampler import shard_indices


def remaining_indices(order: list[int], consumed: int, rank: int, world_size: int) -> list[int]:
    """Rank `rank` of `world_size`'s share of the samples not yet read: order[consumed:][rank::world_size]."""
    with Checks("remaining_indices") as check:
        check.integer("consumed", consumed, min=0, max=len(order))
        if check.integer("world_size", world_size, min=1):
            check.integer("rank", rank, min=0, max=world_size - 1)
    return list(order[consumed:][rank::world_size])


def step_count(remaining: int, per_rank: int, world_size: int) -> int:
    """Samples all ranks read together in a step of `per_rank` each: b·M, or what is left."""
    return min(remaining, per_rank * world_size)


def exactly_once(record: list[dict], num_items: int, epoch: int = 0) -> dict:
    """Check a record (entries {"epoch", "world_size", "rank", "indices"}) for one epoch:
    {"read": samples read, "missing": indices never read, "twice": indices read more than
    once, "ok": every index in 0..num_items-1 read exactly once}."""
    counts = [0] * num_items
    for entry in record:
        if entry["epoch"] == epoch:
            for i in entry["indices"]:
                counts[i] += 1
    missing = [i for i, c in enumerate(counts) if c == 0]
    twice = [i for i, c in enumerate(counts) if c > 1]
    return {"read": sum(counts), "missing": missing, "twice": twice, "ok": not missing and not twice}


class ElasticSampler:
    """The position in an epoch, (epoch, consumed), and this rank's record; see the module
    docstring. It is DCP's `Stateful`: `torch.distributed.checkpoint` saves and loads it
    through `state_dict` / `load_state_dict`."""

    def __init__(self, num_items: int, seed: int = 0, shuffle: bool = True):
        with Checks("ElasticSampler") as check:
            check.integer("num_items", num_items, min=1)
            check.integer("seed", seed, min=0)
            check.rule(isinstance(shuffle, bool), f"shuffle={shuffle!r} must be True or False")
        self.num_items, self.seed, self.shuffle = num_items, seed, shuffle
        self.epoch, self.consumed = 0, 0
        self.history: list[dict] = []     # what earlier worlds read (from a checkpoint)
        self.mine: list[int] = []         # what this rank read since the last load
        self.rank = self.world_size = None

    def order(self) -> list[int]:
        """The epoch's permutation (n,), the same on every rank: shard_indices with one replica."""
        return shard_indices(self.num_items, 1, 0, self.epoch, self.seed, self.shuffle)

    def remaining(self) -> int:
        return self.num_items - self.consumed

    def indices(self, rank: int, world_size: int) -> list[int]:
        """Rank `rank` of `world_size`'s share of the rest of the epoch, in reading order."""
        return remaining_indices(self.order(), self.consumed, rank, world_size)

    def next_batch(self, rank: int, world_size: int, per_rank: int) -> list[int]:
        """This rank's batch of the next step (at most `per_rank` indices, possibly fewer at
        the end of the epoch), recorded; every rank's `consumed` advances by the step's
        global count. Call on every rank with the same world_size and per_rank."""
        with Checks("ElasticSampler.next_batch") as check:
            check.integer("per_rank", per_rank, min=1)
            check.rule(self.remaining() > 0, f"epoch {self.epoch} is finished ({self.num_items} samples read): "
                                             f"call set_epoch(epoch + 1)")
            if check.integer("world_size", world_size, min=1):
                check.integer("rank", rank, min=0, max=world_size - 1)
            check.rule(self.world_size in (None, world_size) and self.rank in (None, rank),
                       f"rank {rank} of {world_size} asked, but this sampler read as rank {self.rank} of "
                       f"{self.world_size} since its last load: a resized world loads the state first")
        mine = self.indices(rank, world_size)[:per_rank]               # (<= per_rank,)
        self.consumed += step_count(self.remaining(), per_rank, world_size)
        self.rank, self.world_size = rank, world_size
        self.mine += mine
        return mine

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` from its first sample (the record keeps earlier epochs)."""
        with Checks("ElasticSampler.set_epoch") as check:
            check.integer("epoch", epoch, min=0)
        if epoch != self.epoch:
            self.history += self._own_entry()
            self.mine, self.epoch, self.consumed = [], epoch, 0

    def _own_entry(self) -> list[dict]:
        return [{"epoch": self.epoch, "world_size": self.world_size, "rank": self.rank,
                 "indices": list(self.mine)}] if self.mine else []

    def record(self) -> list[dict]:
        """What was read: the history loaded with the state, then this rank's own reads."""
        return self.history + self._own_entry()

    def state_dict(self, group=None) -> dict:
        """The position and the record of every rank (all_gather_object over `group` when
        torch.distributed is initialized: call it on every rank, as dcp.save does). The
        record travels as one JSON string: DCP would flatten a list of dicts into keys
        that a loading sampler, not knowing the list's length, could not ask for."""
        import torch.distributed as dist

        own = self._own_entry()
        if dist.is_available() and dist.is_initialized():
            gathered = [None] * dist.get_world_size(group)
            dist.all_gather_object(gathered, own, group=group)
            own = [e for entries in gathered for e in entries]
        return {"epoch": self.epoch, "consumed": self.consumed, "num_items": self.num_items,
                "seed": self.seed, "shuffle": self.shuffle, "record": json.dumps(self.history + own)}

    def load_state_dict(self, state: dict) -> None:
        """Go on from a saved position with any world size (refused for another dataset,
        seed or shuffle: the permutation would differ)."""
        if not isinstance(state, dict):
            raise TypeError(f"ElasticSampler.load_state_dict: state must be a dict from state_dict(), got {state!r}")
        with Checks("ElasticSampler.load_state_dict") as check:
            for key in ("num_items", "seed", "shuffle"):
                check.rule(state.get(key) == getattr(self, key), f"{key}: saved {state.get(key)!r}, "
                                                                 f"here {getattr(self, key)!r}")
            check.integer("epoch", state.get("epoch"), min=0)
            c = state.get("consumed")
            check.rule(is_int(c) and 0 <= c <= self.num_items, f"consumed={c!r} is not in 0..{self.num_items}")
        self.epoch, self.consumed = state["epoch"], state["consumed"]
        self.history, self.mine = json.loads(state.get("record", "[]")), []
        self.rank = self.world_size = None
