"""Zero-bubble schedules: the backward split into B (input gradient, what the previous
stage waits for) and W (weight gradient, what nothing waits for), with the W's moved
into the bubbles (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", ICLR 2024, arXiv
2401.10241). Naive first, then better:

    zbh1_schedule(p, m)       1F1B with each rank's W's delayed to fill its cool-down
                              (Sec. 2.1, Fig. 3 top): bubble (p-1)(T_F + T_B - T_W),
                              a third of 1F1B's (p-1)(T_F + T_B + T_W) when T_F = T_B = T_W
    zbv_schedule(p, m)        two chunks per rank in a V (Sec. 6, Fig. 8): zero bubble
                              when T_F = T_B = T_W, still at 1F1B's memory
    dualpipev_schedule(p, m)  DeepSeek's DualPipe cut in half onto the same V (DeepSeek-AI
                              2024, "DeepSeek-V3 Technical Report", Sec. 3.2.1, Fig. 5):
                              forward of one micro-batch paired with the backward of
                              another, so that one's communication hides behind the
                              other's compute

Each returns a `Schedule` (`ddnb.pipeline_parallel.actions`) that the static checker
(`ddnb.pipeline_parallel.check.validate_schedule`) proves and prices. ZB-V and DualPipeV
give the same per-rank order of (op, micro-batch, stage) as torch.distributed.pipelining's
ScheduleZBVZeroBubble and ScheduleDualPipeV (torch 2.13), read in our F/B/W as follows:
torch's F is F; its I (BACKWARD_INPUT) is our B; its W is W; its B (FULL_BACKWARD) is
our B followed at once by W of the same micro-batch; its OVERLAP_F_B (F;B) pair is the F
followed by that B (and W): on one device they run one after the other, in that order,
as torch's runtime runs the pair's sub-actions. The executor
(`ddnb.pipeline_parallel.executor`) runs them on real stages (`build_stages` places them
in the V), B and W split as `ddnb.pipeline_parallel.split_backward` does; `simulate` runs
them on paper and `ddnb.viz.pipeline` draws them, W in a colour of its own.
Taught in `notebooks/09b_zero_bubble.ipynb` (after `notebooks/09_pipeline_parallelism.ipynb`).
"""
from __future__ import annotations

from collections import Counter, deque

from ddnb._checks import Checks, check_positive_ints
from ddnb.pipeline_parallel.actions import BACKWARD, FORWARD, WEIGHT, Action, Schedule, v_placement


def zbh1_schedule(stages: int, microbatches: int) -> Schedule:
    """ZB-H1 (Qi et al. 2024, Sec. 2.1, Fig. 3 top), the handcrafted schedule at 1F1B's
    memory. In steady state rank r repeats the triple F(x), B(x - (p-1-r)), W(x - (p-1)):
    the F and B of 1F1B (the last stage runs B(j) right after F(j), each stage up one
    micro-batch later), with the W lagging its B by r micro-batches. Walking x = 0 ..
    m+p-2 and dropping the indices outside 0..m-1 gives the whole list: p-1-r lone
    forwards, r (F, B) pairs, the triples, p-1-r (B, W) pairs, then r lone W's. The
    delayed W's of the lower ranks let their B's go up the pipeline without waiting and
    fill the cool-down that 1F1B leaves idle.

    Memory: rank r holds p - r micro-batches' whole activations (F until B, 1F1B's
    count) plus r whose B has freed all but what W needs: (p-r)M_B + r·M_W, at most p·M_B
    on rank 0, 1F1B's peak (the paper's Sec. 2.3, (p-i+1)M_B + (i-1)M_W for worker i
    counted from 1). Counted F until W, every rank has p in flight (and with torch's
    split, which the executor runs, M_W = M_B: p·M_B on every rank, `split_backward`).
    Bubble: (p-1)(T_F + T_B - T_W) per rank (Sec. 2.3, Table 2); with T_F = T_B = T_W that
    is (p-1)/(3m + p - 1) of the step (exactly what `simulate` gives for m >= p), against
    1F1B's (p-1)(T_F + T_B + T_W), (p-1)/(m + p - 1). The same order as torch's
    ScheduleInterleavedZeroBubble with one stage per rank."""
    check_positive_ints("zbh1_schedule", stages=stages, microbatches=microbatches)
    p, m = stages, microbatches
    out = []
    for r in range(p):
        acts = []
        for x in range(m + p - 1):
            for op, j in ((FORWARD, x), (BACKWARD, x - (p - 1 - r)), (WEIGHT, x - (p - 1))):
                if 0 <= j < m:
                    acts.append(Action(op, j))
        out.append(acts)
    return Schedule(out)


class _RankList:
    """One rank's list being written: chunk 0 / 1 hold stages r / 2p-1-r; the next
    micro-batch of each (op, chunk) is counted, as torch's generators count them."""

    def __init__(self):
        self.acts, self.next, self.weights = [], Counter(), deque()

    def add(self, op: str, chunk: int) -> int:
        j = self.next[op, chunk]
        self.next[op, chunk] += 1
        self.acts.append(Action(op, j, chunk))
        return j

    def input_grad(self, chunk: int) -> None:
        """torch's I: B alone, its W queued for later."""
        self.weights.append(Action(WEIGHT, self.add(BACKWARD, chunk), chunk))

    def full_backward(self, chunk: int) -> None:
        """torch's B: B and W at once."""
        self.acts.append(Action(WEIGHT, self.add(BACKWARD, chunk), chunk))

    def queued_weight(self, chunk: int | None = None) -> None:
        """The oldest W still owed (on `chunk`, if given), if any."""
        w = next((a for a in self.weights if chunk is None or a.chunk == chunk), None)
        if w is not None:
            self.weights.remove(w)
            self.acts.append(w)


def zbv_schedule(stages: int, microbatches: int) -> Schedule:
    """ZB-V (Qi et al. 2024, Sec. 6, Fig. 8): the model cut into 2p stages, rank r holding
    stages r (chunk 0) and 2p-1-r (chunk 1), so a micro-batch goes down the ranks and back
    up, and rank 0 both starts and ends it. The order is torch's ScheduleZBVZeroBubble:
    rank r runs 2(p-r)-1 forwards on chunk 0; r pairs (F chunk 1, F chunk 0); p-r triples
    (F, B, W on chunk 1); then, until the forwards run out, F B W on chunk 0 and F B W on
    chunk 1; then r pairs (B chunk 0, B chunk 1) and p-r pairs (B, W on chunk 0); then the
    W's still owed, chunk 1's first. As torch does, it is built for max(m, 2p-1) micro-
    batches and the ones past m dropped, so small m keep the same shape.

    Memory: each chunk is half a stage, and rank r holds at most 2p (micro-batch, chunk)
    pairs, p whole stages' worth: 1F1B's p·M_B, on every rank alike (Sec. 6).
    Bubble: the paper's is zero when T_F = T_B = T_W (Sec. 6). On the unit-cost model of
    `simulate` (T_F = T_B = T_W = 1 per stage) every rank idles (p-1)/2, half a forward
    per rank of the ramp, whatever m >= 2p-1: the first micro-batch's chunk-0 forwards
    going down the V. 1F1B idles 3(p-1) per rank, ZB-H1 p-1."""
    check_positive_ints("zbv_schedule", stages=stages, microbatches=microbatches)
    p, m = stages, microbatches
    n = max(2 * p - 1, m)
    out = []
    for r in range(p):
        w = _RankList()
        for _ in range(2 * (p - r) - 1):
            w.add(FORWARD, 0)
        for _ in range(r):
            w.add(FORWARD, 1)
            w.add(FORWARD, 0)
        for _ in range(p - r):
            w.add(FORWARD, 1)
            w.full_backward(1)
        while w.next[FORWARD, 1] < w.next[FORWARD, 0] or w.next[FORWARD, 0] < n:
            if w.next[FORWARD, 0] < n:
                w.add(FORWARD, 0)
            w.full_backward(0)
            w.add(FORWARD, 1)
            w.full_backward(1)
        for _ in range(r):
            w.input_grad(0)
            w.input_grad(1)
        for _ in range(p - r):
            w.input_grad(0)
            w.queued_weight(0)
        for c in (1, 0):                                 # the W's still owed: chunk 1's, then chunk 0's
            while any(a.chunk == c for a in w.weights):
                w.queued_weight(c)
        out.append([a for a in w.acts if a.microbatch < m])
    return Schedule(out, placement=v_placement(p))


def check_dualpipev_counts(check: Checks, stages: int, microbatches: int) -> bool:
    """DualPipeV's rule (torch's too): at least as many micro-batches as virtual stages."""
    return check.rule(microbatches >= 2 * stages, f"DualPipeV needs at least as many micro-batches as virtual "
                      f"stages: microbatches({microbatches}) < 2 x stages({stages})")


def dualpipev_schedule(stages: int, microbatches: int) -> Schedule:
    """DualPipeV (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", Sec. 3.2.1, Fig. 5;
    the "cut-in-half" DualPipe of deepseek-ai/DualPipe): DualPipe feeds micro-batches from
    both ends of the pipeline and keeps two copies of the parameters; folded in half onto
    the V placement of ZB-V (rank r: stages r and 2p-1-r) it keeps one. Its heart is the
    steady state, where each rank pairs the forward of one chunk with the full backward of
    the other, (F chunk 0, B chunk 1) then (F chunk 1, B chunk 0): on a GPU the pair's
    all-to-all and p2p traffic hides behind the other half's compute. The order is
    torch's ScheduleDualPipeV, in eight steps for rank r:
      1. 2(p-r-1) forwards on chunk 0          5. p-r-1 times: B chunk 1, then the pair
      2. r+1 pairs (F chunk 0, F chunk 1)          (F chunk 1, B chunk 0)
      3. p-r-1 times: B and W on chunk 1      6. r+1 pairs (B chunk 1, B chunk 0), the
         (zero-bubble), F chunk 1                  second half of them split: B now, W owed
      4. m-2p+r+1 times the two pairs          7. p-r-1 times: an owed W, B chunk 0
         (F 0, B 1), (F 1, B 0)                 8. r+1 owed W's
    A full backward is our B followed by its W; torch's split ones (I) are our B with the
    W queued, run oldest first. Needs m >= 2p (torch's rule too).
    Memory: 2p + 1 (micro-batch, chunk) pairs per rank once m >= 2p: DualPipe's "PP + 1"
    activations per device, with PP = 2p virtual stages. Bubble: the report's
    (PP/2-1)(F&B + B - 3W) (Table 2, B a full backward) prices overlapped F&B pairs,
    which `simulate` (one action at a time) does not model; on its unit-cost model
    DualPipeV idles (p-1)/2 per rank, as ZB-V."""
    with Checks("dualpipev_schedule") as check:
        if check.positive_ints(stages=stages, microbatches=microbatches):
            check_dualpipev_counts(check, stages, microbatches)
    p, m = stages, microbatches
    out = []
    for r in range(p):
        w = _RankList()
        for _ in range(2 * (p - r - 1)):                             # 1
            w.add(FORWARD, 0)
        for _ in range(r + 1):                                       # 2
            w.add(FORWARD, 0)
            w.add(FORWARD, 1)
        for _ in range(p - r - 1):                                   # 3
            w.input_grad(1)
            w.queued_weight()
            w.add(FORWARD, 1)
        for _ in range(m - 2 * p + r + 1):                           # 4 (torch does not overlap the last
            w.add(FORWARD, 0)                                        #   rank's first pair: same order)
            w.full_backward(1)
            w.add(FORWARD, 1)
            w.full_backward(0)
        for _ in range(p - r - 1):                                   # 5
            w.full_backward(1)
            w.add(FORWARD, 1)
            w.full_backward(0)
        split = False                                                # 6
        for i in range(r + 1):
            split = split or (i == (r + 1) // 2 and r % 2 == 1)
            (w.input_grad if split else w.full_backward)(1)
            split = split or (i == (r + 1) // 2 and r % 2 == 0)
            (w.input_grad if split else w.full_backward)(0)
        for _ in range(p - r - 1):                                   # 7
            w.queued_weight()
            (w.input_grad if split else w.full_backward)(0)
        for _ in range(r + 1):                                       # 8
            w.queued_weight()
        out.append(w.acts)
    return Schedule(out, placement=v_placement(p))
