"""One stage of a pipeline: a contiguous slice of an nn.Sequential on one rank, and the
point-to-point messages that join it to its neighbours.

Rank r of `group` holds layers [start_r, end_r) (`partition_layers`). Its forward receives a
micro-batch's activation from rank r-1, runs the slice and sends the output to r+1; its
backward receives the gradient of that output from r+1, back-propagates through the
slice (accumulating the parameters' .grad) and sends the gradient of its input to r-1.
This is the "model parallelism with micro-batches" of Huang et al. 2019 (GPipe,
Sec. 2.2): the micro-batches keep several stages busy at once.

    model = gpt(cfg, seed=0)                       # the same on every rank
    stage = PipelineStage(model, microbatches=4, batch_shape=(32, cfg.seq_len))
    stage.module                                   # this rank's layers, e.g. model[2:4]

Nothing hangs on a shape: every rank works out the shapes of the activations it will
receive and send when it is built, from `batch_shape` and the layers before it (one
forward of a zero micro-batch, no communication), and checks the configuration (stages
<= layers, micro-batches dividing the batch) before any message is posted, so a bad one
raises ValueError on every rank at once. Messages go through `ddnb.collectives.p2p.post`
(one traced `dist.batch_isend_irecv`: a send and the next receive posted together, as
Megatron-LM's `send_forward_recv_backward`, Narayanan et al. 2021, Sec. 4.1); receives are waited on,
sends only at the end of the step, so a schedule that `validate_schedule` accepts cannot
deadlock. Each message is tagged with its micro-batch and the stage it goes to (gloo
matches by tag; NCCL ignores tags and matches first-in first-out, which the schedules'
order also satisfies). For interleaved schedules a rank holds several stages, one per
model chunk (`chunk`, `chunks`). Taught in `notebooks/09_pipeline_parallelism.ipynb`.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ddnb.collectives import p2p
from ddnb.pipeline_parallel.naive import partition_layers
from ddnb.trace import Tracer


def check_microbatches(batch_size: int, microbatches: int) -> int:
    """The micro-batch size batch_size / microbatches, or ValueError if it is not whole."""
    bad = [f"{k}={v!r}" for k, v in (("batch_size", batch_size), ("microbatches", microbatches))
           if isinstance(v, bool) or not isinstance(v, int) or v < 1]
    if bad:
        raise ValueError(f"batch_size and microbatches must be integers >= 1, got {', '.join(bad)}")
    if batch_size % microbatches:
        raise ValueError(f"microbatches({microbatches}) does not divide batch_size({batch_size}): "
                         f"{batch_size} % {microbatches} = {batch_size % microbatches}")
    return batch_size // microbatches


class PipelineStage:
    """This rank's slice of `model` (an nn.Sequential built the same on every rank) and
    its messages. `boundaries`: the [start, end) layers of each stage (default
    `partition_layers(len(model), world_size)`). `batch_shape` / `input_dtype`: the whole
    batch that enters stage 0, e.g. (B, T) int64 token ids; B must split into
    `microbatches`. The state of one step (inputs, outputs, losses per micro-batch) lives
    here between the forward and backward of each micro-batch.

    Interleaved schedules cut the model into chunks·p virtual stages; rank r then builds
    one PipelineStage per chunk c (`chunk=c, chunks=v`), holding virtual stage c·p + r
    (Narayanan et al. 2021, Sec. 2.2.2). Its messages go to rank r±1, wrapping from the
    last rank to rank 0 between chunks."""

    def __init__(self, model: nn.Sequential, microbatches: int, batch_shape, input_dtype=torch.long,
                 group=None, boundaries=None, tracer: Tracer | None = None, device=None,
                 chunk: int = 0, chunks: int = 1):
        batch_shape = tuple(batch_shape)
        self.microbatch_size = check_microbatches(batch_shape[0] if batch_shape else 0, microbatches)
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        if not (isinstance(chunks, int) and isinstance(chunk, int) and chunks >= 1 and 0 <= chunk < chunks):
            raise ValueError(f"need integers chunks >= 1 and 0 <= chunk < chunks, "
                             f"got chunk={chunk!r}, chunks={chunks!r}")
        self.chunk, self.chunks = chunk, chunks
        self.num_stages = chunks * self.world_size                          # virtual stages
        self.stage_index = chunk * self.world_size + self.rank
        boundaries = partition_layers(len(model), self.num_stages) if boundaries is None else list(boundaries)
        _check_boundaries(boundaries, len(model), self.num_stages)
        self.group, self.tracer, self.microbatches = group, tracer, microbatches
        self.boundaries = boundaries
        self.start, self.end = boundaries[self.stage_index]
        self.is_first, self.is_last = self.stage_index == 0, self.stage_index == self.num_stages - 1
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.module = model[self.start:self.end]
        mb_shape = (self.microbatch_size,) + batch_shape[1:]
        self.recv_shape, self.recv_dtype, self.send_shape, self.send_dtype = _boundary_meta(
            model, self.start, self.end, mb_shape, input_dtype, self.device)
        self.reset()

    # ------------------------------------------------------------------ state of one step
    def reset(self) -> None:
        """Forget the previous step's micro-batches (gradients stay in the parameters)."""
        self.inputs: dict[int, torch.Tensor] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.losses: dict[int, torch.Tensor] = {}
        self._posted: dict[tuple[str, int], p2p.Pending] = {}   # (op, mb) -> its posted receive
        self._sends: list[p2p.Pending] = []                     # posted sends, waited at flush()

    def forward(self, mb: int, x: torch.Tensor, target: torch.Tensor | None = None,
                loss_fn=None) -> torch.Tensor | None:
        """F(mb) on `x`: micro-batch mb itself on stage 0, else the activation `receive`d
        from rank-1. On the last stage the loss loss_fn(out, target) / m is kept for the
        backward (the step's loss is the mean over micro-batches). Returns what must be
        sent to rank+1 (None on the last stage)."""
        if not self.is_first:
            x = x.requires_grad_()              # a leaf: its .grad is what B(mb) sends back to rank-1
        out = self.module(x)                    # (b, ...) -> (b, ...)
        self.inputs[mb] = x
        if self.is_last:
            self.losses[mb] = loss_fn(out, target) / self.microbatches
            return None
        self.outputs[mb] = out
        return out.detach()

    def backward(self, mb: int, grad: torch.Tensor | None = None) -> torch.Tensor | None:
        """B(mb): back-propagate the kept loss (last stage) or `grad`, the gradient of this
        stage's output `receive`d from rank+1; this frees the micro-batch's graph. Returns
        the gradient of the stage's input, to send to rank-1 (None on stage 0)."""
        if self.is_last:
            torch.autograd.backward(self.losses[mb])
        else:
            torch.autograd.backward(self.outputs.pop(mb), grad)     # d loss / d out, (b, ...)
        x = self.inputs.pop(mb)
        return None if self.is_first else x.grad

    # ------------------------------------------------------------------ messages
    def needs_recv(self, op: str, mb: int) -> bool:
        return (op == "F" and not self.is_first) or (op == "B" and not self.is_last)

    def communicate(self, send: tuple[str, int, torch.Tensor] | None, recv: tuple[str, int] | None,
                    recv_stage: "PipelineStage | None" = None) -> None:
        """Post a send (("F", mb, activation) to rank+1 or ("B", mb, grad) to rank-1) and the
        receive the next action needs (("F", mb) from rank-1, ("B", mb) from rank+1; for
        `recv_stage`, another chunk of this rank, if given) together (`p2p.post`).
        Nothing is waited for here: the send is traced as its posting and completed by
        `flush()`, the receive by `receive()`. Each message is tagged with its micro-batch
        and the virtual stage it goes to, so receives never pick up the wrong one."""
        ops, rs = [], self if recv_stage is None else recv_stage
        if send is not None:
            op, mb, tensor = send
            step = 1 if op == "F" else -1                     # activations go down, gradients up
            ops.append(p2p.Op("send", tensor.contiguous(), (self.rank + step) % self.world_size,
                              tag=_tag(op, mb, self.stage_index + step, self.num_stages),
                              name=_name(op, mb), extra={"microbatch": mb}))
        if recv is not None:
            rop, rmb = recv
            shape, dtype = (rs.recv_shape, rs.recv_dtype) if rop == "F" else (rs.send_shape, rs.send_dtype)
            buf = torch.empty(shape, dtype=dtype, device=rs.device)
            ops.append(p2p.Op("recv", buf, (rs.rank + (-1 if rop == "F" else 1)) % rs.world_size,
                              tag=_tag(rop, rmb, rs.stage_index, rs.num_stages),
                              name=_name(rop, rmb), extra={"microbatch": rmb}))
        pending = p2p.post(ops, self.group, self.tracer)
        if send is not None:
            pending[0].record()
            self._sends.append(pending[0])
        if recv is not None:
            rs._posted[(rop, rmb)] = pending[-1]

    def receive(self, op: str, mb: int) -> torch.Tensor:
        """Wait for what action (op, mb) needs: the activation of micro-batch mb from rank-1
        ("F") or the gradient of its output from rank+1 ("B"), posting the receive if
        `communicate` has not already."""
        if (op, mb) not in self._posted:
            self.communicate(None, (op, mb))
        pending = self._posted.pop((op, mb))
        pending.wait()
        return pending.tensor

    def flush(self) -> None:
        """Wait for every send of the step (their receivers have all posted by now)."""
        for pending in self._sends:
            pending.wait()
        self._sends.clear()


def _name(op: str, mb: int) -> str:
    """The trace name of micro-batch mb's activation ("F") or gradient ("B") message."""
    return f"{'act' if op == 'F' else 'grad'} {mb}"


def _tag(op: str, mb: int, dest_stage: int, num_stages: int) -> int:
    """The tag of micro-batch mb's activation ("F") or gradient ("B") arriving at virtual stage dest_stage."""
    return 2 * (mb * num_stages + dest_stage) + (op == "B")


def _check_boundaries(boundaries, layers: int, stages: int) -> None:
    ok = (len(boundaries) == stages and boundaries[0][0] == 0 and boundaries[-1][1] == layers
          and all(a < b for a, b in boundaries) and all(boundaries[i][1] == boundaries[i + 1][0]
                                                        for i in range(len(boundaries) - 1)))
    if not ok:
        raise ValueError(f"boundaries {boundaries} must be {stages} non-empty contiguous [start, end) ranges "
                         f"covering layers 0..{layers} (stages={stages}, layers={layers})")


@torch.no_grad()
def _boundary_meta(model: nn.Sequential, start: int, end: int, mb_shape, dtype, device):
    """Shapes and dtypes of the activation entering layer `start` and leaving layer `end`,
    from one forward of a zero micro-batch through layers [0, end) (local, no messages)."""
    x = torch.zeros(mb_shape, dtype=dtype, device=device)
    recv = (tuple(x.shape), x.dtype)
    for i, layer in enumerate(model[:end]):
        if i == start:
            recv = (tuple(x.shape), x.dtype)
        x = layer(x)
    return recv[0], recv[1], tuple(x.shape), x.dtype
