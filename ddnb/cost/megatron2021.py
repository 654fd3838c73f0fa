"""The layout cost model (`ddnb.cost.layout`) against Megatron-LM's Table 1: does it predict the
achieved TFLOP/s per GPU of each published (t, p, d) layout, from physical constants alone?

Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", SC21 (arXiv 2104.04473), Table 1: GPT models of 1.7 B to 1 T parameters, weak
scaling on 32 to 3,072 A100s of the Selene cluster. Sec. 5: 80 GB A100s, 312 TFLOP/s 16-bit
peak, 8 per node on NVLink/NVSwitch, eight 200 Gb/s HDR InfiniBand HCAs per node, mixed
precision; Sec. 5.1: sequence 2048, vocabulary 51,200, activation recomputation, the
interleaved schedule with the scatter/gather optimization. TABLE_1 is the table as printed
(checked against a transcription of the paper's text; the PDF itself was not reachable
here). The micro-batch sizes and model chunks are not in the paper: they come from the
authors' script for this table, `examples/sc21/run_table_1.sh` in NVIDIA/Megatron-LM
(MBS; v = layers / (p x --num-layers-per-virtual-pipeline-stage); it interleaves only the
76 B to 530 B rows, uses `--recompute-method uniform` everywhere, and torch's DDP, which
overlaps the gradient all-reduce with backward, for the four smallest rows: the model
charges that all-reduce in full, 1.5% to 4.3% of their predicted step).

Achieved FLOP/s as the paper counts them: its Eq. (3), F = 96·B·s·l·h²·(1 + s/6h + V/16lh)
per iteration, recomputation included (`layout_flops` with checkpointing equals it exactly),
over the predicted step time x GPUs.

The constants, physical and the same for every row (`SELENE`): peak 312 TFLOP/s; NVLink 300
GB/s each way (A100 datasheet: 600 GB/s both ways); one 200 Gb/s HCA per GPU = 25 GB/s;
latencies 3 us and 5 us, assumed as in `ddnb.emulate.PROFILES["ib"]`; and ONE compute
efficiency, EFFICIENCY = 171 / 312 = 0.548. The paper states no single-GPU GEMM throughput
(its Fig. 7, one GPU running a 4-layer model with 32-channel heads, reaches about 68 to 91
TFLOP/s, a small-kernel case: as the efficiency, 91/312 would put the rows 34% to 54% low). 171 TFLOP/s per
GPU is the best end-to-end rate the paper reports anywhere (Table 2: the 530 B model on 560
GPUs, model-parallel size 280, micro-batch 1, batch 2,240, a bubble of a few percent): a
measured lower bound on what its kernels reach, taken as is, not fitted to Table 1. The
bubble is the interleaved (p - 1)/(v·m) of the step's ideal time, with the artifact's v.

What the model gets wrong, and why (`megatron2021_rows()` prints each row's error): with one
efficiency it cannot see that larger h makes larger, more efficient GEMMs and relatively
cheaper memory-bound kernels (LayerNorm, softmax, dropout: O(sbh) bytes against O(sbh²)
FLOPs), which is the paper's own explanation of its superlinear scaling. So it over-predicts
the small models (+23% at 1.7 B) and under-predicts the largest (-16% at 1 T, whose
non-interleaved 64-stage pipeline also pays an 11% bubble in the model); the mean |error| is
9%. All ten rows are within the 25% target with this constant, but only because it falls in
a narrow band: the target holds for EFFICIENCY between about 0.49 and 0.557, no value brings
every row within 18% (0.53 is the best, +-19%), and calibrating it instead by running this
model on the Table 2 run (about 0.60) would put the 1.7 B and 3.6 B rows at +34% and +26%.
Taught in `notebooks/16_capstone.ipynb`: it checks the model that `notebooks/12_scalability.ipynb`
builds for data parallelism, extended to every axis.
"""
from __future__ import annotations

from ddnb.cost.layout import Layout, layout_flops, layout_memory, layout_step_time
from ddnb.emulate.profile import Link, Profile

VOCAB, SEQ_LEN, PEAK = 51_200, 2048, 312e12
EFFICIENCY = 171 / 312     # Table 2's best per-GPU rate over the peak: see the module docstring

# Narayanan et al. 2021, Table 1, as printed: parameters (billions), attention heads, hidden size,
# layers, tensor-parallel size t, pipeline-parallel size p, GPUs, batch size, achieved TFLOP/s per GPU;
# then the artifact's micro-batch size and model chunks per pipeline rank (examples/sc21/run_table_1.sh).
TABLE_1 = [
    # params, heads, hidden, layers, t, p, gpus, batch, tflops, microbatch, chunks
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137, 16, 1),
    (3.6, 32, 3072, 30, 2, 1, 64, 512, 138, 16, 1),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142, 16, 1),
    (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135, 8, 1),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138, 4, 1),
    (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140, 2, 3),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148, 2, 2),
    (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155, 1, 2),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163, 1, 3),
    (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163, 1, 1),
]

SELENE = Profile(
    "selene", peak_flops=PEAK, efficiency=EFFICIENCY, memory_bandwidth=2.039e12,
    intra=Link(3e-6, 300e9, "NVLink 3 / NVSwitch"), inter=Link(5e-6, 25e9, "HDR InfiniBand, one HCA per GPU"),
    ranks_per_host=8, slowdown=1.0,
    source="Narayanan et al. 2021, Sec. 5 (312 TFLOP/s 16-bit, 8 A100 80 GB per node, NVLink/NVSwitch, 8 x 200 Gb/s "
           "HDR per node); A100 datasheet (600 GB/s NVLink both ways, 2.039 TB/s HBM2e); latencies assumed; "
           "efficiency 171/312 from the paper's Table 2")


def megatron2021_rows(profile: Profile = SELENE) -> list[dict]:
    """One dict per Table 1 row: model ("1.7B"), tensor, pipeline, data, gpus, microbatch_size,
    chunks, paper_tflops, predicted_tflops (Eq. (3) FLOPs / (predicted step x GPUs)), error
    ((predicted - paper) / paper), memory (bytes on the fullest GPU, predicted) and the step's
    parts in seconds."""
    rows = []
    for params, heads, hidden, layers, t, p, gpus, batch, tflops, b, v in TABLE_1:
        shape = {"n_layers": layers, "d_model": hidden, "n_heads": heads, "vocab_size": VOCAB, "seq_len": SEQ_LEN}
        layout = Layout(dp=gpus // (t * p), pp=p, tp=t, checkpointing=True, microbatch_size=b, chunks=v)
        time = layout_step_time(shape, layout, profile, batch)
        predicted = layout_flops(shape, batch, True) / (time["step_time"] * gpus) / 1e12
        rows.append({"model": f"{params}B", "tensor": t, "pipeline": p, "data": layout.dp, "gpus": gpus,
                     "microbatch_size": b, "chunks": v, "paper_tflops": tflops,
                     "predicted_tflops": round(predicted, 1), "error": round((predicted - tflops) / tflops, 3),
                     "memory": layout_memory(shape, layout, batch)["total"], "parts": time})
    return rows
