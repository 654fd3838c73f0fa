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
matches by tag; NCCL ignores tags and matches first-in first-out, which
`validate_schedule` proves for one chunk per rank only: the several chunks of interleaved
1F1B, ZB-V and DualPipeV are tested on gloo).

A rank holds several stages, one per model chunk, where the schedule cuts the model into
more virtual stages than ranks; which chunk holds which virtual stage is the schedule's
placement (`ddnb.pipeline_parallel.actions.placement_of`): looped (chunk c of rank r is
c·p + r, interleaved 1F1B) or V (r and 2p-1-r, ZB-V and DualPipeV). Build them from the
schedule, and each stage knows its neighbours' ranks from the placement:

    schedule = get_schedule("zbv", p, m)
    stages = build_stages(model, schedule, m, (B, T))      # this rank's, one per chunk
    run_schedule(stages, schedule, idx, targets, lm_loss)

Two consecutive virtual stages on the same rank (the V's turn) hand over in memory, with
no message (`run_schedule` passes the tensor; torch's `set_local_fwd_input` does the same).
Where the schedule has W actions the stage splits its backward (`backward` is B,
`backward_weight` is W, `ddnb.pipeline_parallel.split_backward`) and holds a micro-batch
until its W. Taught in `notebooks/09_pipeline_parallelism.ipynb`.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ddnb.collectives import p2p
from ddnb.pipeline_parallel.actions import looped_placement, placement_of, stage_owners
from ddnb.pipeline_parallel.check import placement_problems
from ddnb.pipeline_parallel.naive import partition_layers
from ddnb.pipeline_parallel.split_backward import backward_input, backward_weight
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
    its messages. `boundaries`: the [start, end) layers of each virtual stage (default
    `partition_layers(len(model), p·chunks)`). `batch_shape` / `input_dtype`: the whole
    batch that enters stage 0, e.g. (B, T) int64 token ids; B must split into
    `microbatches`. The state of one step (inputs, outputs, losses per micro-batch) lives
    here between the forward and backward (and W) of each micro-batch.

    A rank can hold several virtual stages, one PipelineStage per model chunk c
    (`chunk=c`): which one is `placement[rank][c]` (a schedule's `placement_of`; default
    the looped c·p + rank of interleaved 1F1B, Narayanan et al. 2021, Sec. 2.2.2), and
    `chunks` defaults to the placement's chunks per rank. Its messages go to the ranks
    that hold the neighbouring virtual stages (`prev_rank`, `next_rank`: None at either
    end of the model; this rank's own at the V's turn). `build_stages` makes a rank's
    stages for a schedule. `activation`: the (shape, dtype) of one micro-batch's tensor
    between any two stages where the caller knows it, e.g. ((b, T, d), torch.float32);
    it skips the zero forward, which would communicate where the layers do (a
    tensor-parallel layer all-reduces, ddnb.grid4d)."""

    def __init__(self, model: nn.Sequential, microbatches: int, batch_shape, input_dtype=torch.long,
                 group=None, boundaries=None, tracer: Tracer | None = None, device=None,
                 chunk: int = 0, chunks: int | None = None, placement=None, activation=None):
        batch_shape = tuple(batch_shape)
        self.microbatch_size = check_microbatches(batch_shape[0] if batch_shape else 0, microbatches)
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        p = self.world_size
        if placement is not None and len(placement) != p:
            raise ValueError(f"PipelineStage: the placement {placement} has {len(placement)} ranks, "
                             f"the group has world_size({p})")
        v = (1 if chunks is None else chunks) if placement is None else len(placement[self.rank])
        if not (isinstance(v, int) and isinstance(chunk, int) and v >= 1 and 0 <= chunk < v
                and chunks in (None, v)):
            raise ValueError(f"need integers chunks >= 1 and 0 <= chunk < chunks (chunks: the placement's "
                             f"chunks per rank, where one is given), got chunk={chunk!r}, chunks={chunks!r}, "
                             f"placement={placement!r}")
        self.placement = looped_placement(p, v) if placement is None else [list(row) for row in placement]
        problems = placement_problems(self.placement, p, v)
        if problems:
            raise ValueError(f"PipelineStage: {problems[0]} (world_size {p})")
        self.chunk, self.chunks = chunk, v
        self.num_stages = v * p                                            # virtual stages
        self.stage_index = self.placement[self.rank][chunk]
        owners = stage_owners(self.placement)
        self.prev_rank = owners[self.stage_index - 1][0] if self.stage_index > 0 else None
        self.next_rank = owners[self.stage_index + 1][0] if self.stage_index < self.num_stages - 1 else None
        boundaries = partition_layers(len(model), self.num_stages) if boundaries is None else list(boundaries)
        _check_boundaries(boundaries, len(model), self.num_stages)
        self.group, self.tracer, self.microbatches = group, tracer, microbatches
        self.boundaries = boundaries
        self.start, self.end = boundaries[self.stage_index]
        self.is_first, self.is_last = self.prev_rank is None, self.next_rank is None
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.module = model[self.start:self.end]
        mb_shape = (self.microbatch_size,) + batch_shape[1:]
        if activation is not None:                      # given: no forward here
            shape, dtype = tuple(activation[0]), activation[1]
            self.recv_shape, self.recv_dtype = (mb_shape, input_dtype) if self.start == 0 else (shape, dtype)
            self.send_shape, self.send_dtype = shape, dtype
        else:
            self.recv_shape, self.recv_dtype, self.send_shape, self.send_dtype = _boundary_meta(
                model, self.start, self.end, mb_shape, input_dtype, self.device)
        self.reset()

    # ------------------------------------------------------------------ state of one step
    def reset(self, split: bool = False) -> None:
        """Forget the previous step's micro-batches (gradients stay in the parameters);
        `split`: this step's backward is split into B and W (the schedule has W actions)."""
        self.split = split
        self.inputs: dict[int, torch.Tensor] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.losses: dict[int, torch.Tensor] = {}
        self._for_weight: dict[int, tuple] = {}                  # mb -> what its W needs (split only)
        self._posted: dict[tuple[str, int], p2p.Pending] = {}   # (op, mb) -> its posted receive
        self._sends: list[p2p.Pending] = []                     # posted sends, waited at flush()

    @property
    def held(self) -> int:
        """Micro-batches whose state this stage holds now: from F until B, or until W
        when the backward is split (what `validate_schedule`'s peak_in_flight counts)."""
        return len(self.inputs)

    def forward(self, mb: int, x: torch.Tensor, target: torch.Tensor | None = None,
                loss_fn=None) -> torch.Tensor | None:
        """F(mb) on `x`: micro-batch mb itself on stage 0, else the activation received
        from the previous virtual stage. On the last stage the loss loss_fn(out, target) / m
        is kept for the backward (the step's loss is the mean over micro-batches). Returns
        what the next virtual stage needs (None on the last stage)."""
        if not self.is_first:
            x = x.requires_grad_()              # a leaf: its gradient is what B(mb) sends back
        out = self.module(x)                    # (b, ...) -> (b, ...)
        self.inputs[mb] = x
        if self.is_last:
            self.losses[mb] = loss_fn(out, target) / self.microbatches
            return None
        self.outputs[mb] = out
        return out.detach()

    def backward(self, mb: int, grad: torch.Tensor | None = None) -> torch.Tensor | None:
        """B(mb): back-propagate the kept loss (last stage) or `grad`, the gradient of this
        stage's output from the next virtual stage. Returns the gradient of the stage's
        input, for the previous virtual stage (None on stage 0). Without a split this is
        the whole backward (the .grad of the weights too) and frees the micro-batch; with
        one it is the input gradient alone, and the micro-batch stays held until W."""
        root, root_grad = (self.losses[mb], None) if self.is_last else (self.outputs.pop(mb), grad)
        if self.split:
            dx, self._for_weight[mb] = backward_input(root, root_grad, self.inputs[mb], self.module.parameters())
            return dx
        torch.autograd.backward(root, root_grad)
        x = self.inputs.pop(mb)
        return None if self.is_first else x.grad

    def backward_weight(self, mb: int) -> None:
        """W(mb): accumulate the weights' gradients of micro-batch mb into .grad from what
        B(mb) kept, and free the micro-batch (`split_backward.backward_weight`)."""
        backward_weight(self._for_weight.pop(mb), self.module.parameters())
        self.inputs.pop(mb)

    # ------------------------------------------------------------------ messages
    def source(self, op: str) -> int | None:
        """The rank that action `op`'s input comes from: F's activation from the previous
        virtual stage, B's gradient from the next; None where it needs none (W, F on the
        first stage, B on the last)."""
        return {"F": self.prev_rank, "B": self.next_rank}.get(op)

    def destination(self, op: str) -> int | None:
        """The rank that action `op`'s output goes to (F: the next virtual stage's, B: the
        previous one's); None where there is none."""
        return {"F": self.next_rank, "B": self.prev_rank}.get(op)

    def needs_recv(self, op: str, mb: int) -> bool:
        """Whether (op, mb) waits for a message: its input comes from another rank."""
        return self.source(op) not in (None, self.rank)

    def communicate(self, send: tuple[str, int, torch.Tensor] | None, recv: tuple[str, int] | None,
                    recv_stage: "PipelineStage | None" = None) -> None:
        """Post a send (("F", mb, activation) to the next virtual stage's rank or ("B", mb,
        grad) to the previous one's) and the receive the next action needs (("F", mb) or
        ("B", mb); for `recv_stage`, another chunk of this rank, if given) together
        (`p2p.post`). Nothing is waited for here: the send is traced as its posting and
        completed by `flush()`, the receive by `receive()`. Each message is tagged with its
        micro-batch and the virtual stage it goes to, so receives never pick up the wrong one."""
        ops, rs = [], self if recv_stage is None else recv_stage
        if send is not None:
            op, mb, tensor = send
            ops.append(p2p.Op("send", tensor.contiguous(), self.destination(op),
                              tag=_tag(op, mb, self.stage_index + (1 if op == "F" else -1), self.num_stages),
                              name=_name(op, mb), extra={"microbatch": mb}))
        if recv is not None:
            rop, rmb = recv
            shape, dtype = (rs.recv_shape, rs.recv_dtype) if rop == "F" else (rs.send_shape, rs.send_dtype)
            buf = torch.empty(shape, dtype=dtype, device=rs.device)
            ops.append(p2p.Op("recv", buf, rs.source(rop), tag=_tag(rop, rmb, rs.stage_index, rs.num_stages),
                              name=_name(rop, rmb), extra={"microbatch": rmb}))
        pending = p2p.post(ops, self.group, self.tracer)
        if send is not None:
            pending[0].record()
            self._sends.append(pending[0])
        if recv is not None:
            rs._posted[(rop, rmb)] = pending[-1]

    def receive(self, op: str, mb: int) -> torch.Tensor:
        """Wait for what action (op, mb) needs: the activation of micro-batch mb ("F") or
        the gradient of its output ("B"), posting the receive if `communicate` has not
        already."""
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


def build_stages(model: nn.Sequential, schedule, microbatches: int, batch_shape, **kwargs) -> list[PipelineStage]:
    """This rank's stages for `schedule` (a list per rank, or a `Schedule` with its
    placement), one per model chunk in chunk order, each holding the virtual stage the
    schedule's placement gives it: what `run_schedule(stages, schedule, ...)` takes.
    `kwargs` go to every `PipelineStage` (group, tracer, boundaries, input_dtype, device)."""
    placement = placement_of(schedule)
    rank = dist.get_rank(kwargs.get("group"))
    chunks = len(placement[rank]) if 0 <= rank < len(placement) else 1   # else PipelineStage says why
    return [PipelineStage(model, microbatches, batch_shape, chunk=c, placement=placement, **kwargs)
            for c in range(chunks)]


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
