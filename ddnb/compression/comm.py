"""What every compression hook shares: the bucket it is handed, the two traced collectives
it sends with, and the already-completed future it returns.

A communication hook has torch DDP's signature, `hook(state, bucket) -> Future[Tensor]`
(`torch.distributed.algorithms.ddp_comm_hooks`; `ddp.register_comm_hook(state, hook)`):
`bucket.buffer()` is the flat gradient bucket (numel,) holding this rank's *local*
gradients (not yet divided by N); `bucket.gradients()` are per-parameter views into it
(a hook that writes them writes the buffer); the hook leaves the average over the ranks
in the buffer and returns a future of it. `Bucket` is that object for ddnb's
`BucketedDataParallel.register_comm_hook`, so one hook (ddnb's, or torch's own) runs on
both wrappers.

Every message a hook sends goes through `allreduce` or `allgather` here, which record one
"collective" event in the tracer: nbytes = the payload this rank hands to the collective
(the tensor it contributes), method = the hook's name, step = the state's step. The bytes
per step of a method are the sum of those events (`bytes_per_step`), which the tests
compare with each method's formula, exactly. (On the wire a ring all-reduce of S bytes
sends 2(N-1)/N·S per rank, a ring all-gather (N-1)·S: `wire_bytes`.)
Taught in `notebooks/14_precision_compression.ipynb`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ddnb.collectives import traced
from ddnb.trace import Tracer


@dataclass
class Bucket:
    """torch.distributed.GradBucket's interface, for BucketedDataParallel: bucket `index`
    of `count`, its flat `buffer` (numel,) and the views of its parameters' gradients."""

    index_: int
    buffer_: torch.Tensor
    views: list = field(default_factory=list)
    params: list = field(default_factory=list)
    count: int = 1

    def index(self) -> int:
        return self.index_

    def buffer(self) -> torch.Tensor:
        return self.buffer_

    def set_buffer(self, tensor: torch.Tensor) -> None:
        self.buffer_ = tensor

    def gradients(self) -> list[torch.Tensor]:
        return list(self.views)

    def parameters(self) -> list[torch.Tensor]:
        return list(self.params)

    def is_last(self) -> bool:
        return self.index_ == self.count - 1


def done(tensor: torch.Tensor) -> torch.futures.Future:
    """A future already holding `tensor`: ddnb's hooks communicate synchronously."""
    fut = torch.futures.Future()
    fut.set_result(tensor)
    return fut


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def allreduce(tensor: torch.Tensor, group=None, tracer: Tracer | None = None, name: str = "all_reduce",
              **fields) -> torch.Tensor:
    """Sum `tensor` over the ranks of `group`, in place; traced (nbytes = its bytes) by the
    one traced layer over torch's collectives (`ddnb.collectives.traced`): in an emulated
    cluster it is timed by the messages of the ring it runs (`ddnb.emulate.messages`)."""
    return traced.all_reduce(tensor, group, tracer, name, **fields)


def allgather(tensor: torch.Tensor, group=None, tracer: Tracer | None = None, name: str = "all_gather",
              **fields) -> torch.Tensor:
    """Every rank's `tensor` (S,), stacked in rank order: (N, S); traced (nbytes = S's bytes,
    what this rank contributes; `ddnb.collectives.traced`)."""
    return traced.all_gather(tensor, group, tracer, name, **fields)


def bytes_per_step(events: list[dict], method: str | None = None) -> dict[int, int]:
    """{step: bytes} summed over a rank's "collective" events that carry a step (all the
    hooks' events, or those of `method`)."""
    out: dict[int, int] = {}
    for e in events:
        if e["kind"] == "collective" and "step" in e and "method" in e and (method is None or e["method"] == method):
            out[e["step"]] = out.get(e["step"], 0) + e["nbytes"]
    return out


def wire_bytes(events: list[dict], world_size: int) -> int:
    """Bytes one rank sends on the wire for these events, if every collective ran as a
    ring: 2(N-1)/N·S per all-reduce of S bytes, (N-1)·S per all-gather of S bytes each."""
    n = world_size
    return sum(2 * (n - 1) * e["nbytes"] // n if e.get("op") == "all_reduce" else (n - 1) * e["nbytes"]
               for e in events if e["kind"] == "collective" and "op" in e)


class HookWork:
    """A hook's future as BucketedDataParallel awaits it: is_completed(), then wait()
    copies the future's value into the bucket unless the hook wrote the bucket itself."""

    def __init__(self, future: torch.futures.Future, buffer: torch.Tensor):
        self.future, self.buffer = future, buffer

    def is_completed(self) -> bool:
        return self.future.done()

    def wait(self) -> None:
        value = self.future.wait()
        value = value[0] if isinstance(value, (list, tuple)) else value
        if value.data_ptr() != self.buffer.data_ptr():
            self.buffer.copy_(value)

    done = is_completed          # the names of a concurrent.futures.Future (allreduce != "torch")
    result = wait
