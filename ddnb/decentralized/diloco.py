"""Low-communication training: DiLoCo and streaming DiLoCo, against DDP, on one task.

DiLoCo (Douillard et al. 2023, "DiLoCo: Distributed Low-Communication Training of Language
Models", arXiv 2311.08105, Algorithm 1): every worker i takes H inner AdamW steps from the
global parameters theta alone, then the workers average their parameter deltas and take one
outer step of SGD with Nesterov momentum (lr 0.7, momentum 0.9: the paper's Sec. 3):

    theta_i <- AdamW^H(theta)                          H inner steps, no communication
    Delta   = (1/N) sum_i (theta - theta_i)            the outer gradient: one all-reduce per H steps
    theta   <- OuterSGD(theta, Delta)                  Nesterov, exactly torch.optim.SGD(nesterov=True)

so a worker sends the parameters' bytes once per H steps where DDP sends them every step.
Streaming DiLoCo (Douillard et al. 2025, "Streaming DiLoCo with overlapping communication",
arXiv 2501.18512, Algorithm 2): the parameters are cut into F fragments p, each synchronized
every H steps on a staggered schedule (fragment p after steps t with (t - t_p) % H == 0,
t_p = p·H // F, Sec. 2.2), so one synchronization carries 1/F of the bytes; its all-reduce
overlaps the next `overlap` (tau) inner steps, after which the outer result is merged into
the local fragment, theta_i,p <- mix · theta_i,p + (1 - mix) · theta_p (alpha, Sec. 2.3; with
tau = 0 the fragment is replaced); the deltas may travel in bfloat16 (Sec. 2.4 quantizes).

    config = DiLoCoConfig(steps=500, inner_steps=50)
    results = cluster.run(train_diloco, config)        # per rank; RUNS[method] for each method
    theta = simulate_diloco("diloco", config, n=4)["params"]    # the single-process reference

Every exchange is an all-reduce of the traced layer (`ddnb.collectives.traced`): in an emulated
cluster its bytes are those of the ring's real messages (counted by the emulator) and its time
their alpha + n/B on the profile's link; in real mode bytes_sent counts the tensors handed to
it. The task is `ddnb.decentralized.markov`. Taught in `notebooks/16b_slow_link.ipynb`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from ddnb._checks import Checks, is_int
from ddnb.collectives import chunk_bounds
from ddnb.decentralized.markov import MarkovChain, markov_mlp, next_token_loss

METHODS = ("ddp", "diloco", "streaming_diloco")


@dataclass(frozen=True)
class DiLoCoConfig:
    """One run of `METHODS`. `validate(world_size)` lists every broken rule at once.

    steps           inner steps per worker: the token budget, steps · batch_size · length tokens per worker
    inner_steps     H: inner steps between two synchronizations (of one fragment, streaming)
    batch_size, length        sequences per worker per step, tokens per sequence
    inner_lr, weight_decay    the inner AdamW's (DDP uses the same AdamW on the averaged gradient)
    outer_lr, outer_momentum, nesterov   the outer SGD (the paper: 0.7, 0.9, Nesterov)
    fragments       F (streaming): the parameters cut into F fragments, synchronized staggered
    overlap         tau (streaming): inner steps an all-reduce overlaps before its result is merged
    mix             alpha (streaming, tau > 0): local <- mix · local + (1 - mix) · global
    bf16            the deltas all-reduced in bfloat16 (DiLoCo and streaming; DDP stays float32)
    vocab, width, hidden, seed    the task (`markov.MarkovChain`) and model (`markov.markov_mlp`)
    """
    steps: int = 500
    inner_steps: int = 50
    batch_size: int = 16
    length: int = 32
    inner_lr: float = 3e-3
    weight_decay: float = 0.01
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    nesterov: bool = True
    fragments: int = 4
    overlap: int = 1
    mix: float = 0.5
    bf16: bool = False
    vocab: int = 64
    width: int = 64
    hidden: int = 128
    seed: int = 0

    def validate(self, world_size: int = 1) -> "DiLoCoConfig":
        """Raise ValueError naming every bad field (with its value), else return self."""
        with Checks(f"invalid DiLoCoConfig for world_size={world_size}") as check:
            check.integer("world_size", world_size, min=1)
            check.positive_ints(steps=self.steps, batch_size=self.batch_size, length=self.length, vocab=self.vocab,
                                width=self.width, hidden=self.hidden)
            h = check.integer("inner_steps", self.inner_steps, min=1, why=" (H, inner steps per synchronization)")
            f = check.integer("fragments", self.fragments, min=1, why=" (F, streaming's fragments)")
            if h and is_int(self.steps) and self.steps >= 1:
                check.rule(self.steps % self.inner_steps == 0, f"steps={self.steps} is not a multiple of "
                           f"inner_steps={self.inner_steps} (the run must end on an outer step)")
            if h and f:
                check.rule(self.fragments <= self.inner_steps, f"fragments={self.fragments} > inner_steps="
                           f"{self.inner_steps}: need F <= H (one fragment per step at most, staggered)")
                check.integer("overlap", self.overlap, min=0, max=max(0, self.inner_steps // self.fragments - 1),
                              why=f" (tau: less than H // F = {self.inner_steps // self.fragments} steps, so a "
                                  f"fragment's all-reduce ends before the next fragment's starts)")
            check.number("inner_lr", self.inner_lr, positive=True)
            check.number("weight_decay", self.weight_decay, min=0)
            check.number("outer_lr", self.outer_lr, positive=True)
            check.number("outer_momentum", self.outer_momentum, min=0, below=1)
            check.rule(isinstance(self.nesterov, bool), f"nesterov={self.nesterov!r}: need True or False")
            check.rule(not self.nesterov or self.outer_momentum != 0,
                       "nesterov=True with outer_momentum=0: Nesterov needs momentum > 0 (as torch.optim.SGD)")
            check.number("mix", self.mix, min=0, below=1, why=" (alpha: the local share of the merge)")
            check.rule(isinstance(self.bf16, bool), f"bf16={self.bf16!r}: need True or False")
            check.integer("seed", self.seed, min=0)
        return self


# ---------------------------------------------------------------- the outer step (Algorithm 1, lines 8-10)
def nesterov_step(delta: torch.Tensor, global_param: torch.Tensor, momentum_buffer: torch.Tensor,
                  lr: float = 0.7, momentum: float = 0.9, nesterov: bool = True) -> torch.Tensor:
    """One tensor's outer step on the outer gradient `delta`, in place, as torch.optim.SGD
    (dampening 0, no weight decay; a zero buffer is torch's first step):
    b <- m b + delta;  theta <- theta - lr (delta + m b) (Nesterov) or theta - lr b."""
    momentum_buffer.mul_(momentum).add_(delta)
    return global_param.add_(delta.add(momentum_buffer, alpha=momentum) if nesterov else momentum_buffer, alpha=-lr)


def outer_step(params, global_params, momentum_buffers, lr: float = 0.7, momentum: float = 0.9,
               nesterov: bool = True):
    """DiLoCo's outer step (Douillard et al. 2023, Algorithm 1): for each tensor, the outer
    gradient global - params (params: the workers' averaged parameters), then Nesterov SGD
    on the global parameters and the momentum buffers (zeros at first), both in place.
    Lists of tensors; returns global_params."""
    for p, g, b in zip(params, global_params, momentum_buffers):
        nesterov_step(g - p, g, b, lr, momentum, nesterov)
    return global_params


# ---------------------------------------------------------------- schedules as plain data
def fragment_bounds(numel: int, fragments: int) -> list[tuple[int, int]]:
    """[(start, stop)] of the F fragments of the flat parameter vector: contiguous, equal
    to an element (`ddnb.collectives.chunk_bounds`' layout)."""
    return chunk_bounds(numel, fragments)


def offsets(inner_steps: int, fragments: int) -> list[int]:
    """t_p = p · H // F: fragment p's place in the stagger."""
    return [p * inner_steps // fragments for p in range(fragments)]


def sync_schedule(steps: int, inner_steps: int, fragments: int = 1) -> list[tuple[int, int]]:
    """[(step, fragment)] in order: fragment p is synchronized after step t (1..steps) when
    (t - t_p) % H == 0 (t_p = p·H // F). F = 1 is DiLoCo: every H-th step."""
    t_p = offsets(inner_steps, fragments)
    return [(t, p) for t in range(1, steps + 1) for p in range(fragments)
            if t >= t_p[p] and (t - t_p[p]) % inner_steps == 0]


# ---------------------------------------------------------------- one worker's model and the exchange
class _Replica:
    """One worker's model, its AdamW, its stream of batches."""

    def __init__(self, config: DiLoCoConfig, rank: int, chain: MarkovChain):
        self.rank, self.chain, self.c = rank, chain, config
        self.model = markov_mlp(config.vocab, config.width, config.hidden, config.seed)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=config.inner_lr, weight_decay=config.weight_decay)

    def loss(self, step: int) -> torch.Tensor:
        self.opt.zero_grad(set_to_none=True)
        x, y = self.chain.batch(self.c.batch_size, self.c.length, self.rank, step)         # (B, L) each
        loss = next_token_loss(self.model(x), y)
        loss.backward()
        return loss

    def flat(self) -> torch.Tensor:
        return parameters_to_vector(self.model.parameters()).detach()                       # (S,)

    def load(self, flat: torch.Tensor) -> None:
        vector_to_parameters(flat.clone(), self.model.parameters())


class _Done:
    def __init__(self, value):
        self.value = value

    def wait(self):
        return self.value


class Simulated:
    """The exchange of `simulate_diloco`: the mean of the M workers' tensors, in one process."""
    bytes_from = "none (simulated)"

    def launch(self, tensors, bf16: bool = False, wait_later: bool = False):
        total = tensors[0].bfloat16() if bf16 else tensors[0].clone()
        for t in tensors[1:]:
            total += t.bfloat16() if bf16 else t
        return _Done((total / len(tensors)).float()), 0


class Traced:
    """The exchange of a real run: this rank's tensor all-reduced (sum, then / N) with the
    traced layer, blocking or launched now and waited later (streaming's overlap)."""

    def __init__(self, group, tracer):
        from ddnb.collectives import p2p

        self.group, self.tracer, self.n = group, tracer, p2p.group_size(group)
        self.bytes_from = "emulated ring messages" if self._em() else "all-reduce payload (real mode)"

    @staticmethod
    def _em():
        from ddnb.emulate import current

        return current()

    def _sent(self) -> int:
        em = self._em()
        return em.bytes_sent if em is not None else 0

    def launch(self, tensors, bf16: bool = False, wait_later: bool = False):
        """(a handle whose wait() gives the mean, float32; the bytes this rank sent for it,
        filled in at wait)."""
        from ddnb.collectives import traced
        from ddnb.trace import get_tracer, now

        t = tensors[0].bfloat16() if bf16 else tensors[0].clone()
        payload, before, start = t.numel() * t.element_size(), self._sent(), now()
        me, n = self, self.n

        class Handle:
            bytes = 0

            def wait(self):
                if wait_later:
                    work.wait()
                    get_tracer(me.tracer).record("collective", "outer all_reduce", start, now(), nbytes=payload,
                                                 op="all_reduce")
                self.bytes = me._sent() - before if me._em() is not None else payload
                return (t / n).float()

        if wait_later and n > 1:
            work = traced.all_reduce_async(t, self.group)
        else:
            wait_later = False
            traced.all_reduce(t, self.group, self.tracer, name="outer all_reduce") if n > 1 else None
        return Handle(), None


# ---------------------------------------------------------------- the loop every method runs
def _run(method: str, config: DiLoCoConfig, ranks: list[int], comm, n: int) -> dict:
    """The loop of `method` over the workers `ranks` held here (one rank in a real run, all
    N in `simulate_diloco`), exchanging through `comm`. Returns the run's stats."""
    from ddnb.trace import now

    chain = MarkovChain(config.vocab, seed=config.seed)
    reps = [_Replica(config, r, chain) for r in ranks]
    theta = reps[0].flat().clone()                                  # (S,) the global parameters
    buf = torch.zeros_like(theta)                                   # (S,) the outer momentum
    F_ = config.fragments if method == "streaming_diloco" else 1
    bounds = fragment_bounds(theta.numel(), F_)
    when: dict[int, list[int]] = {}
    for t, p in sync_schedule(config.steps, config.inner_steps, F_) if method != "ddp" else []:
        when.setdefault(t, []).append(p)
    tau = config.overlap if method == "streaming_diloco" else 0
    bf16 = config.bf16 and method != "ddp"
    losses, times, sync_bytes, pending = [], [], [], {}
    t0 = now()
    for step in range(config.steps):
        ls = [r.loss(step) for r in reps]
        if method == "ddp":                                         # DDP: average the gradients, every step
            grads = [parameters_to_vector([p.grad for p in r.model.parameters()]) for r in reps]   # (S,) each
            h, _ = comm.launch(grads)
            g = h.wait()
            sync_bytes.append(h.bytes if hasattr(h, "bytes") else 0)
            for r in reps:
                vector_to_parameters(g.clone(), [p.grad for p in r.model.parameters()])
        for r in reps:
            r.opt.step()
        losses.append(sum(x.item() for x in ls) / len(ls))
        for p in when.get(step + 1, []):                            # launch fragment p's outer all-reduce
            a, b = bounds[p]
            h, _ = comm.launch([theta[a:b] - r.flat()[a:b] for r in reps], bf16=bf16, wait_later=tau > 0)
            pending.setdefault(min(step + 1 + tau, config.steps), []).append((p, h))
        for p, h in pending.pop(step + 1, []):                      # its result: outer step, then merge
            a, b = bounds[p]
            nesterov_step(h.wait(), theta[a:b], buf[a:b], config.outer_lr, config.outer_momentum, config.nesterov)
            sync_bytes.append(getattr(h, "bytes", 0))
            for r in reps:
                x = r.flat().clone()
                x[a:b] = config.mix * x[a:b] + (1 - config.mix) * theta[a:b] if tau > 0 else theta[a:b]
                r.load(x)
        times.append(now() - t0)
    end = now() - t0
    if method == "ddp":
        theta = reps[0].flat().clone()
    evaluator = markov_mlp(config.vocab, config.width, config.hidden, config.seed)
    vector_to_parameters(theta.clone(), evaluator.parameters())
    with torch.no_grad():
        final = next_token_loss(evaluator(chain.held_out()[0]), chain.held_out()[1]).item()
    return {"method": method, "world_size": n, "inner_steps": config.inner_steps if method != "ddp" else 1,
            "fragments": F_, "losses": losses, "times": times, "syncs": len(sync_bytes),
            "bytes_sent": sum(sync_bytes), "peak_bytes_per_sync": max(sync_bytes, default=0),
            "bytes_from": comm.bytes_from, "emulated_time": end, "final_loss": final,
            "entropy_rate": chain.entropy_rate, "params": theta, "numel": theta.numel(), "config": asdict(config)}


def _train(method: str, config: DiLoCoConfig, group=None, tracer=None) -> dict:
    from ddnb.collectives import p2p, traced

    n, rank = p2p.group_size(group), p2p.group_rank(group)
    config.validate(n)                             # before any message: every rank raises alike
    comm = Traced(group, tracer)
    if n > 1:
        traced.barrier(group, tracer, name="start")
    return dict(_run(method, config, [rank], comm, n), rank=rank)


def train_ddp(config: DiLoCoConfig, group=None, tracer=None) -> dict:
    """Call on every rank: the baseline, AdamW on the gradients all-reduced every step."""
    return _train("ddp", config, group, tracer)


def train_diloco(config: DiLoCoConfig, group=None, tracer=None) -> dict:
    """Call on every rank: DiLoCo (Algorithm 1), H = config.inner_steps."""
    return _train("diloco", config, group, tracer)


def train_streaming_diloco(config: DiLoCoConfig, group=None, tracer=None) -> dict:
    """Call on every rank: streaming DiLoCo, F = config.fragments staggered, overlap tau."""
    return _train("streaming_diloco", config, group, tracer)


RUNS = {"ddp": train_ddp, "diloco": train_diloco, "streaming_diloco": train_streaming_diloco}


def simulate_diloco(method: str, config: DiLoCoConfig, n: int) -> dict:
    """`method` with n workers simulated in one process: the same batches, AdamW steps and
    outer steps, the all-reduce a mean (what a run on n processes must match, to rounding)."""
    if method not in METHODS:
        raise ValueError(f"method={method!r} is not one of {METHODS}")
    config.validate(n)
    return _run(method, config, list(range(n)), Simulated(), n)
