"""One pipeline step of the GPT on every rank, checked against one process and against
PyTorch's pipelining: the harness of `notebooks/09_pipeline_parallelism.ipynb`.

    runs = cluster.run(pipeline_step, "1f1b", 8, 2)     # m = 8 micro-batches, 2 repeats
    all(r["ref_err"] < 1e-5 and r["torch_err"] < 1e-5 for r in runs)

Every rank builds the same GPT (`ddnb.models.gpt`, seed 0) and keeps its slice
(`build_stages`); the batch is the sequence-reversal task of `ddnb.models`. The schedules
are GPipe (Huang et al. 2019), 1F1B and interleaved 1F1B (Narayanan et al. 2019, 2021),
and the zero-bubble ZB-H1, ZB-V (Qi et al. 2024) and DualPipeV (DeepSeek-AI 2024), which
torch.distributed.pipelining is not asked to check here.
"""
from __future__ import annotations

from ddnb._checks import Checks
from ddnb.models import GPTConfig

PIPELINE_CFG = GPTConfig(vocab_size=16, seq_len=16, d_model=64, n_heads=4, n_layers=6)


def pipeline_step(name: str, m: int, repeats: int = 1, batch_size: int = 32, torch_check: bool = True,
                  CFG: GPTConfig = PIPELINE_CFG) -> dict:
    """Run `repeats` steps of schedule `name` (any of `SCHEDULES`; "interleaved", "zbv"
    and "dualpipev" give each rank 2 model chunks) with `m` micro-batches of the batch of `batch_size`
    sequences, on this rank's stage(s) of the GPT `CFG`. Call it on every rank at once.
    Returns, for this rank and the last repeat:

        loss, events (the traced F / B spans and messages), peak (activation bytes),
        in_flight, layers ([start, end) of each chunk)
        and with torch_check: ref_err and torch_err, the largest difference of this
        rank's gradients from one process on the whole model (`reference_grads`) and from
        torch.distributed.pipelining (`torch_pipeline_grads`; None for the zero-bubble
        schedules), and ref_loss.
    """
    import torch.distributed as dist
    from ddnb.models import gpt, lm_loss, synthetic_task
    from ddnb.pipeline_parallel import (SCHEDULES, build_stages, get_schedule, num_chunks, reference_grads,
                                        run_schedule, torch_pipeline_grads)
    from ddnb.trace import Tracer

    with Checks("pipeline_step") as check:
        check.choice("name", name, SCHEDULES)
        check.positive_ints(m=m, repeats=repeats, batch_size=batch_size)   # m | batch_size: PipelineStage checks
    p = dist.get_world_size()
    idx, targets = synthetic_task(CFG, batch_size=batch_size, steps=1, seed=0)[0]
    model = gpt(CFG, seed=0)
    tracer = Tracer()
    schedule = get_schedule(name, p, m)            # 2 chunks per rank where it has chunks
    v = num_chunks(schedule)
    stages = build_stages(model, schedule, m, idx.shape, tracer=tracer)
    for _ in range(repeats):                       # the last repeat's events and memory are kept
        model.zero_grad()
        tracer.clear()
        res = run_schedule(stages, schedule, idx, targets, lm_loss, measure_memory=True)
    out = {"loss": res.loss, "events": tracer.take(), "peak": res.peak_activation_bytes, "in_flight": res.in_flight,
           "layers": [(st.start, st.end) for st in stages]}
    if torch_check:
        mine = [q.grad for st in stages for q in st.module.parameters()]
        ref_loss, ref = reference_grads(gpt(CFG, seed=0), idx, targets, lm_loss, m)
        layer_of = [int(n.split(".")[0]) for n, _ in model.named_parameters()]   # "3.attn.qkv.weight" -> 3
        ref = [g for st in stages for g, layer in zip(ref, layer_of) if st.start <= layer < st.end]
        out["ref_err"] = max((a - b).abs().max().item() for a, b in zip(mine, ref))
        out["torch_err"] = None
        if name in ("gpipe", "1f1b", "interleaved"):
            _, theirs = torch_pipeline_grads(gpt(CFG, seed=0), name, idx, targets, lm_loss, m, chunks=v)
            out["torch_err"] = max((a - b).abs().max().item() for a, b in zip(mine, theirs))
        out["ref_loss"] = ref_loss
    return out
