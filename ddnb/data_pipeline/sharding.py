"""Each rank reads only its shards: a deterministic, resumable assignment of shards to ranks.

    reader = ShardedReader(stored, world_size=4, rank=1, seed=0)   # checks every shard first
    reader.set_epoch(3)
    for sample in reader: ...                 # this rank's part of epoch 3, exactly once
    ckpt["data"] = reader.state_dict()        # (epoch, start): saved with the model
    reader.load_state_dict(ckpt["data"])      # goes on with the next sample, not the first

`ddnb.data_parallel.sampler.ShardSampler` (notebook 06) deals *samples* to ranks with a
stride, rank, rank + N, ...: right for a dataset in memory, but with the samples in files it
makes every rank open every file. Here the unit a rank opens is a shard (a tar, a chunk, a
directory). Each epoch the shards are put in one order, the same on every rank (06's
`shard_indices` over the shards, seeded by seed + epoch), the samples in that order are
laid end to end (n = sum of the shard sizes), and rank r takes the contiguous run

    [r·q + min(r, m), (r+1)·q + min(r+1, m))      q = n // N, m = n mod N
                                                  (the first m ranks take one more: torch.tensor_split's cut)

so it opens the shards that run touches: about S/N of the S shards, plus at most one it
shares with each neighbour, whatever the shard sizes (uneven shards need nothing special).
With drop_last every rank takes floor(n/N) samples and the n mod N at the end are skipped,
so synchronous ranks take the same number of steps. This is the scheme of WebDataset's
`split_by_node` with a per-sample cut instead of whole shards, which would leave ranks
with unequal counts when shards are uneven (Aizman et al. 2019).
Taught in `notebooks/01b_data_pipeline.ipynb`.
"""
from __future__ import annotations

from ddnb._checks import Checks, is_int
from ddnb.data_parallel.sampler import _check_epoch, _validate, shard_indices


def rank_spans(shard_sizes, world_size: int, rank: int, epoch: int = 0, seed: int = 0, shuffle: bool = True,
               drop_last: bool = False) -> list[tuple[int, int, int]]:
    """(shard, begin, end) runs of samples rank `rank` reads in `epoch`, in reading order:
    samples begin..end-1 of each shard. Pure: every rank computes every rank's spans."""
    with Checks("rank_spans") as check:
        ok = check.rule(isinstance(shard_sizes, (list, tuple)) and len(shard_sizes) > 0 and
                        all(is_int(s) and s >= 1 for s in shard_sizes),
                        f"shard_sizes={shard_sizes!r}: need a non-empty list of positive ints")
    n = sum(shard_sizes)
    _validate(n if ok else 1, world_size, rank, seed, shuffle, drop_last, where="rank_spans")
    _check_epoch(epoch, "rank_spans")
    order = shard_indices(len(shard_sizes), 1, 0, epoch, seed, shuffle)     # every shard, one order for all ranks
    if drop_last:
        lo, hi = rank * (n // world_size), (rank + 1) * (n // world_size)
    else:
        q, m = divmod(n, world_size)
        lo, hi = rank * q + min(rank, m), (rank + 1) * q + min(rank + 1, m)
    return cut_run(shard_sizes, lo, hi, order)


def cut_run(shard_sizes, lo: int, hi: int, order=None) -> list[tuple[int, int, int]]:
    """Samples lo..hi-1 of the stream made by laying the shards end to end in `order`
    (default 0, 1, ...), as (shard, begin, end) spans."""
    spans, offset = [], 0                       # offset: where shard k starts in the stream
    for k in range(len(shard_sizes)) if order is None else order:
        begin, end = max(lo, offset), min(hi, offset + shard_sizes[k])
        if begin < end:
            spans.append((k, begin - offset, end - offset))
        offset += shard_sizes[k]
    return spans


class ShardedReader:
    """Rank `rank`'s samples of a stored dataset (`ddnb.data_pipeline.formats.Stored`), epoch
    by epoch, from its shards only; resumable from `state_dict()`. Construction checks that
    every shard is readable (`check_readable`): every rank raises the same ValueError
    naming the bad shards before any of them reads or waits for another."""

    def __init__(self, stored, world_size: int, rank: int, seed: int = 0, shuffle: bool = True,
                 drop_last: bool = False):
        from ddnb.data_pipeline.formats import check_readable

        rank_spans(list(stored.sizes), world_size, rank, 0, seed, shuffle, drop_last)   # validates the arguments
        check_readable(stored)
        self.stored, self.world_size, self.rank = stored, world_size, rank
        self.seed, self.shuffle, self.drop_last = seed, shuffle, drop_last
        self.epoch, self.start = 0, 0      # start: samples of this epoch already yielded
        self._litdata = None

    def set_epoch(self, epoch: int) -> None:
        """A new epoch starts at its first sample; the current one keeps its place."""
        _check_epoch(epoch, "ShardedReader.set_epoch")
        if epoch != self.epoch:
            self.epoch, self.start = epoch, 0

    def spans(self) -> list[tuple[int, int, int]]:
        """This epoch's (shard, begin, end) runs for this rank."""
        return rank_spans(list(self.stored.sizes), self.world_size, self.rank, self.epoch, self.seed,
                          self.shuffle, self.drop_last)

    def shards(self) -> list[int]:
        """The shards this rank opens this epoch (from `start` on)."""
        out, skip = [], self.start
        for k, b, e in self.spans():
            if skip < e - b:
                out.append(k)
            skip = max(0, skip - (e - b))
        return out

    def __len__(self) -> int:
        return sum(e - b for _, b, e in self.spans())

    def __iter__(self):
        from ddnb.data_pipeline.formats import read_shard

        if self.stored.format == "litdata" and self._litdata is None:
            from ddnb.data_pipeline.formats import _litdata_dataset

            self._litdata = _litdata_dataset(self.stored.root)
        skip = self.start
        for k, b, e in self.spans():
            if skip >= e - b:
                skip -= e - b
                continue
            for j, sample in enumerate(read_shard(self.stored, k, self._litdata)):
                if j >= e:
                    break
                if j >= b + skip:
                    self.start += 1
                    yield sample
            skip = 0

    def state_dict(self) -> dict:
        """The position (epoch, start) and what fixes the assignment, for a checkpoint."""
        return {"epoch": self.epoch, "start": self.start, "seed": self.seed, "shard_sizes": list(self.stored.sizes),
                "world_size": self.world_size, "rank": self.rank, "shuffle": self.shuffle,
                "drop_last": self.drop_last}

    def load_state_dict(self, state: dict) -> None:
        """Go on from a saved position; refused (naming every difference) when it was saved
        for another assignment (other shards, world size, rank, seed)."""
        mine = self.state_dict()
        with Checks("ShardedReader.load_state_dict") as check:
            if check.rule(isinstance(state, dict) and all(k in state for k in mine),
                          f"state: need a dict from ShardedReader.state_dict() with keys {sorted(mine)}"):
                for k in mine:
                    if k not in ("epoch", "start"):
                        check.rule(state[k] == mine[k], f"{k}: saved {state[k]!r}, here {mine[k]!r}")
        _check_epoch(state["epoch"], "ShardedReader.load_state_dict")
        self.epoch, self.start = state["epoch"], 0
        with Checks("ShardedReader.load_state_dict") as check:
            check.integer("start", state["start"], min=0, max=len(self),
                          why=f" (this rank has {len(self)} samples in epoch {state['epoch']})")
        self.start = state["start"]
