"""Checker for the ring-attention loop of chapter 13: the learner's forward, run on real
processes, against full softmax attention of the whole sequence in one process, causal and
not, output, log-sum-exp and gradients.

Ring attention (Liu, Zaharia & Abbeel 2023, arXiv 2310.01889, Alg. 1): rank r holds the
contiguous shard r of q, k, v (B, H, S/N, D); in step s = 0..N-1 it holds the K/V block of
rank src = (r - s) mod N, attends its queries to it,

    O_j = softmax(q K_jᵀ · scale) V_j,   L_j = logsumexp(q K_jᵀ · scale)

and merges into the running (O, L) by the online softmax (Milakov & Gimelshein 2018;
FlashAttention, Dao et al. 2022, Sec. 3.1):

    L' = log(exp L + exp L_j),   O' = exp(L - L') O + exp(L_j - L') O_j

then sends the block to rank r+1 and receives the next from rank r-1. Causal: the block of
an earlier rank is all past (no mask), its own block is the diagonal (lower triangle), a
later rank's block is all future (skipped, still passed on).

The gradients: the learner's function is the forward of a torch.autograd.Function whose
backward is the library's ring backward (`ddnb.context_parallel.ring_attention.
_RingAttention.backward`, FlashAttention-2's per block, Dao 2023, Alg. 2), which recomputes
P = exp(S - L) from the learner's lse and uses its output: a right output with a wrong lse,
or q, k, v changed in place, shows there. Taught in `notebooks/13_sequence_context_expert.ipynb`.

    check_ring_attention(my_ring)     # my_ring(q, k, v, causal) -> (out, lse) on every rank
"""
from __future__ import annotations

import contextlib

import torch

from ddnb._checks import Checks
from ddnb.exercises.core import compare, passed, run_on_ranks

# what the library (or torch) would do in the learner's place: refused by name, and on the ranks
SHORTCUTS = {"ring_attention": "the library's ring attention", "_RingAttention": "the library's ring attention",
             "around_the_ring": "the library's ring loop", "allgather_attention": "the all-gather scheme",
             "ulysses_attention": "the Ulysses scheme", "all_gather": "an all-gather of k/v",
             "all_gather_into_tensor": "an all-gather of k/v", "all_gather_object": "an all-gather of k/v",
             "broadcast": "a broadcast of k/v"}
REFUSED = "the exercise is the ring itself: attend to the block you hold, merge, pass it on with isend/irecv"


# ----------------------------------------------------------------------------- the data
def inputs(world_size: int, shape, seed: int) -> list[torch.Tensor]:
    """q, k, v and the loss weight w, each (B, H, S, D) float64 with S = N · shard_len."""
    b, h, m, d = shape
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, world_size * m, d, generator=g, dtype=torch.float64) for _ in range(4)]


def reference(full, causal: bool):
    """Full attention of the whole sequence in one process: out (B, H, S, D), lse (B, H, S)
    and the gradients of q, k, v of sum(out ∘ w)."""
    from ddnb.context_parallel import attend_block

    q, k, v = (t.clone().requires_grad_() for t in full[:3])
    out, lse = attend_block(q, k, v, q.shape[-1] ** -0.5, causal)      # masked: tril of the whole sequence
    (out * full[3]).sum().backward()
    return out.detach(), lse.detach(), (q.grad, k.grad, v.grad)


# ----------------------------------------------------------------------------- the usual mistakes
MISTAKES = {
    "unmasked_diagonal": "the diagonal block (your own k/v, src == rank) needs the causal mask: "
                         "attend_block(..., masked=True) there, a query sees itself and the keys before it",
    "mask_every_block": "only the diagonal block (src == rank) is masked: a block of an earlier rank is all "
                        "past, every key visible (masked=False)",
    "future_unskipped": "a block of a later rank (src > rank) is all future under the causal mask: skip its "
                        "compute (still pass it on)",
    "skip_wrong_side": "the wrong side is skipped: keep the blocks of earlier ranks (src < rank, earlier "
                       "positions) and skip the later ones (src > rank)",
    "wrong_direction": "the block you hold at step s is not the one you think: sent to rank+1 and received from "
                       "rank-1, step s holds the block of rank (rank - s) % N; passed the other way it holds "
                       "(rank + s) % N, so the causal mask lands on the wrong blocks",
    "own_block_repeated": "a block was attended twice and another never: each step sends on the block just "
                          "received (kv = the receive buffer), not your own k/v again",
    "last_block_missing": "the last block was never attended: N steps, N blocks (the block received in step "
                          "N-2 needs its compute in step N-1)",
    "summed": "the blocks' outputs were added without their weights: merge them with the online softmax, "
              "out' = exp(L - L') out + exp(L_j - L') O_j (merge)",
    "last_only": "out holds only one block's attention: merge each block into the running (out, lse) instead "
                 "of replacing it",
}


def simulate(qs, ks, vs, causal: bool, mistake: str | None = None):
    """Each rank's (out, lse) of the ring in one process, as written or with one of
    MISTAKES (for the hints): qs, ks, vs the N shards."""
    from ddnb.context_parallel import attend_block, merge

    n, results = len(qs), []
    for r in range(n):
        q, scale = qs[r], qs[r].shape[-1] ** -0.5
        out, lse = torch.zeros_like(q), q.new_full(q.shape[:-1], float("-inf"))
        for s in range(n - 1 if mistake == "last_block_missing" else n):
            src = (r - s) % n                                            # the block the loop thinks it holds
            held = {"wrong_direction": (r + s) % n,                      # the block it really holds
                    "own_block_repeated": r if s == 0 else (r - 1) % n}.get(mistake, src)
            if causal and mistake != "future_unskipped" and (src < r if mistake == "skip_wrong_side" else src > r):
                continue
            masked = causal and (src <= r if mistake == "mask_every_block" else src == r)
            o, l = attend_block(q, ks[held], vs[held], scale, masked and mistake != "unmasked_diagonal")
            if mistake == "summed":
                out, lse = out + o, torch.logaddexp(lse, l)
            elif mistake == "last_only":
                out, lse = o, torch.logaddexp(lse, l)
            else:
                out, lse = merge(out, lse, o, l)
        results.append((out, lse))
    return results


def diagnose_out(outs: list, rank: int, shards, causal: bool) -> str:
    """What a wrong output on `rank` usually means: the mistake that gives every rank's
    output in `outs`, else one that gives this rank's (two mistakes can agree on one rank)."""
    if bool(torch.isnan(outs[rank]).any()):
        return ("a NaN: some query row saw no key at all (the diagonal block keeps its diagonal: tril, not "
                "tril(-1)), or exp(-inf - -inf) in a merge of your own")
    same = {m: [torch.allclose(o, s[0], rtol=1e-5, atol=1e-5) for o, s in zip(outs, simulate(*shards, causal, m))]
            for m in MISTAKES}
    for mistake in sorted(MISTAKES, key=lambda m: not all(same[m])):
        if same[mistake][rank]:
            return MISTAKES[mistake]
    return ("each step: o, l = attend_block(q, k_blk, v_blk, scale, masked); out, lse = merge(out, lse, o, l); "
            "start from out = 0, lse = -inf, scale = D ** -0.5")


def diagnose_lse(got: torch.Tensor, rank: int, shards, causal: bool) -> str:
    """What a wrong log-sum-exp on `rank` (with a right output) usually means."""
    from ddnb.context_parallel import attend_block

    q, ks, vs = shards[0][rank], shards[1], shards[2]
    blocks = [attend_block(q, ks[s], vs[s], q.shape[-1] ** -0.5, causal and s == rank)[1]
              for s in range(len(ks)) if not (causal and s > rank)]
    if any(torch.allclose(got, b) for b in blocks):
        return "that is one block's lse: keep the merged lse that merge returns with the output"
    if torch.allclose(got, torch.stack(blocks).max(0).values):
        return "that is the max of the blocks' lse: the merged lse is log Σ exp L_j (torch.logaddexp)"
    return "lse = log Σ exp(q kᵀ · scale) over every key the query sees: return the lse merge gives back"


# ----------------------------------------------------------------------------- on the ranks
def _code_names(code) -> set[str]:
    names = set(code.co_names)
    for c in code.co_consts:
        if hasattr(c, "co_names"):
            names |= _code_names(c)
    return names


def refuse_shortcuts(fn) -> None:
    """AssertionError when fn's code (nested functions included) names a shortcut."""
    code = getattr(getattr(fn, "func", fn), "__code__", None)
    used = sorted(_code_names(code) & set(SHORTCUTS)) if code is not None else []
    if used:
        raise AssertionError(f"{getattr(fn, '__name__', 'your function')} calls {used[0]}, {SHORTCUTS[used[0]]}: "
                             f"{REFUSED}")


@contextlib.contextmanager
def shortcuts_refused():
    """On a rank: the library's ring attention and torch's all-gathers and broadcast raise
    (a learner's function that reaches them by another name)."""
    import torch.distributed as dist

    from ddnb.context_parallel.ring_attention import _RingAttention

    def refuse(what):
        def raises(*args, **kwargs):
            raise AssertionError(f"your function used {what}: {REFUSED}")
        return raises

    names = [n for n in ("all_gather", "all_gather_into_tensor", "all_gather_object", "broadcast") if hasattr(dist, n)]
    saved = {n: getattr(dist, n) for n in names}
    for n in names:
        setattr(dist, n, refuse(SHORTCUTS[n]))
    _RingAttention.apply = staticmethod(refuse("the library's ring attention"))
    try:
        yield
    finally:
        del _RingAttention.apply                                     # back to torch.autograd.Function.apply
        for n, f in saved.items():
            setattr(dist, n, f)


class BadReturn(Exception):
    """The learner's function did not return (out, lse) of the right shapes."""


def return_problem(got, q) -> str | None:
    """Why `got` is not (out (B, H, m, D), lse (B, H, m)) tensors, or None."""
    if not (isinstance(got, tuple) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)):
        return f"returned {type(got).__name__}: return (out, lse), two tensors"
    if tuple(got[0].shape) != tuple(q.shape) or tuple(got[1].shape) != tuple(q.shape[:-1]):
        return (f"returned out {tuple(got[0].shape)}, lse {tuple(got[1].shape)}: need out {tuple(q.shape)} "
                f"(like q) and lse {tuple(q.shape[:-1])} (one per query row)")
    return None


class _LearnersRing(torch.autograd.Function):
    """forward: the learner's loop; backward: the library's ring backward on its (out, lse)."""

    @staticmethod
    def forward(ctx, q, k, v, fn, causal, box):
        got = fn(q, k, v, causal)
        problem = return_problem(got, q)
        if problem:
            raise BadReturn(problem)
        out, lse = (t.detach().clone() for t in got)
        box["out"], box["lse"] = out, lse
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = None, causal, "contiguous", q.shape[-1] ** -0.5, None   # group, causal, layout, scale, tracer
        return out.clone()

    @staticmethod
    def backward(ctx, grad_out):
        from ddnb.context_parallel.ring_attention import _RingAttention

        dq, dk, dv = _RingAttention.backward(ctx, grad_out)[:3]
        return dq, dk, dv, None, None, None


def on_rank(fn, causal: bool, shape, seed: int) -> dict:
    """This rank's run: the learner's forward on its contiguous shards, then backward of
    sum(out ∘ w). {"out", "lse", "grads", "changed"}, or {"bad": why} on every rank when
    some rank's return was malformed (then no rank starts the backward ring)."""
    import torch.distributed as dist

    n, r = dist.get_world_size(), dist.get_rank()
    full = inputs(n, shape, seed)
    q, k, v = (t.chunk(n, dim=2)[r].clone().requires_grad_() for t in full[:3])
    before = [t.detach().clone() for t in (q, k, v)]
    box, bad = {}, None
    with shortcuts_refused():
        try:
            out = _LearnersRing.apply(q, k, v, fn, causal, box)
        except BadReturn as e:
            bad = str(e)
    flag = torch.tensor([bad is not None], dtype=torch.int64)
    dist.all_reduce(flag)
    if int(flag):
        return {"bad": bad}
    changed = [name for name, t, b in zip("qkv", (q, k, v), before) if not torch.equal(t.detach(), b)]
    (out * full[3].chunk(n, dim=2)[r]).sum().backward()
    return {"out": box["out"], "lse": box["lse"], "grads": (q.grad, k.grad, v.grad), "changed": changed}


# ----------------------------------------------------------------------------- the checker
def check_ring_attention(fn, world_sizes=(3, 4), batch: int = 1, heads: int = 2, shard_len: int = 3,
                         head_dim: int = 4, timeout: float = 30.0) -> str:
    """Run `fn(q, k, v, causal) -> (out, lse)` on each of `world_sizes` real processes, causal
    and not: q, k, v (B, H, S/N, D) float64 are rank r's contiguous shard. out (B, H, S/N, D)
    and lse (B, H, S/N) must equal full softmax attention of the whole sequence in one
    process, rows of this shard (1e-5), and the gradients of q, k, v of sum(out ∘ w) (fn as
    forward, the library's ring backward) the single-process ones. The library's ring
    attention and all-gathers of k/v are refused. Returns the success line, else an
    AssertionError naming the rank and element, with a hint."""
    with Checks("check_ring_attention") as check:
        check.rule(callable(fn), f"fn={fn!r}: need a function fn(q, k, v, causal) returning (out, lse)")
        ok = isinstance(world_sizes, (list, tuple)) and len(world_sizes) > 0
        check.rule(ok, f"world_sizes={world_sizes!r}: need a non-empty list of process counts")
        for i, n in enumerate(world_sizes if ok else ()):
            check.integer(f"world_sizes[{i}]", n, min=2, max=8)
        check.positive_ints(batch=batch, heads=heads, shard_len=shard_len, head_dim=head_dim)
    refuse_shortcuts(fn)
    shape, name = (batch, heads, shard_len, head_dim), getattr(fn, "__name__", "your function")
    for n in world_sizes:
        for seed, causal in enumerate((False, True)):
            got = run_on_ranks(on_rank, n, fn, causal, shape, seed, what=name, timeout=timeout)
            full = inputs(n, shape, seed)
            out, lse, grads = reference(full, causal)
            shards = [list(t.chunk(n, dim=2)) for t in full[:3]]
            where = f"{'causal' if causal else 'non-causal'} ring on {n} processes"
            bad = next(((r, g["bad"]) for r, g in enumerate(got) if g.get("bad")), None)
            if bad:
                raise AssertionError(f"{where}: {name} on rank {bad[0]} {bad[1]}")
            for r, g in enumerate(got):
                want = out.chunk(n, dim=2)[r]
                hint = "" if torch.allclose(g["out"], want, rtol=1e-5, atol=1e-5) else \
                    diagnose_out([h["out"] for h in got], r, shards, causal)
                compare(g["out"], want, rank=r, name=f"output ({where})", hint=hint)
            for r, g in enumerate(got):
                want = lse.chunk(n, dim=2)[r]
                hint = "" if torch.allclose(g["lse"], want, rtol=1e-5, atol=1e-5) else \
                    diagnose_lse(g["lse"], r, shards, causal)
                compare(g["lse"], want, rank=r, name=f"lse ({where})", hint=hint)
            for r, g in enumerate(got):
                if g["changed"]:
                    raise AssertionError(f"{where}: {name} changed {', '.join(g['changed'])} in place on rank {r} "
                                         f"(q *= scale?): leave q, k, v as they are, the backward reuses them")
                for t, dt, want in zip("qkv", g["grads"], grads):
                    compare(dt, want.chunk(n, dim=2)[r], rank=r, name=f"d{t} ({where})",
                            hint="the backward recomputes P = exp(q kᵀ · scale - lse) from your q, k, v and lse: "
                                 "keep them unchanged and return the lse of every key each query sees")
    return passed("check_ring_attention", f"output, lse and dq, dk, dv equal full attention, causal and not, "
                                          f"on {' and '.join(map(str, world_sizes))} processes")
