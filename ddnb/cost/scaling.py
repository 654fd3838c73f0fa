"""Predicted time of one data-parallel training step, from 8 to thousands of workers.

Weak scaling: every worker keeps its batch, so its compute time per step, T_c, does not
change with the number of workers N; what grows is the synchronization of S bytes of
gradients (S = parameters x bytes per parameter). One step costs

    T(N) = T_c + T_comm(N)          (or max(T_c, T_comm) if communication is fully hidden)
    scaling efficiency  E(N) = T(1) / T(N) = T_c / T(N)      (throughput per worker vs. alone)

with T_comm from the alpha-beta-gamma model (`ddnb.cost.alpha_beta`, Thakur et al. 2005):
a message of n bytes costs alpha + n beta, reducing n bytes costs n gamma. Per scheme:

    ps_central    one server; its link serializes N pushes and N pulls (Li et al., OSDI 2014):
                  2N(alpha + S beta) + N S gamma                  (the 2 N S bytes of its link)
    ps_sharded    k servers, S/k bytes each: 2N(alpha + S/k beta) + N S/k gamma, or the
                  worker's own link, 2k alpha + 2 S beta, when that is slower (k > N)
    tree, ring, halving_doubling     `allreduce_time` (ring: 2(N-1) alpha + 2(N-1)/N S beta + ...)
    hierarchical  reduce-scatter in the node, all-reduce across nodes, all-gather in the node
                  (Goyal et al. 2017, Section 4; Jia et al. 2018, "hierarchical all-reduce"; NCCL)
    torus2d       the same three phases on a rows x cols grid of one network: a 2D ring
                  (Mikami et al. 2018, "2D-torus all-reduce"; Ying et al. 2018, TPU pods)

The ring sends the fewest bytes possible, but 2(N-1) messages: its latency term
2(N-1) alpha overtakes its bandwidth term 2(N-1)/N n beta once N > n beta / alpha
(`ring_latency_takeover`); the two-level schemes pay 2(g-1) + 2(m-1) messages instead.
With `bucket_bytes` the gradient goes out in ceil(S / bucket) equal all-reduces, as DDP
and Horovod send it, and every one of them pays the latency.

The networks below are illustrative round numbers, not measurements: 100 Gb/s Ethernet
(RoCE) with ~5 us per message and 400 Gb/s InfiniBand NDR with ~2 us, the order of what
MPI/NCCL point-to-point latencies are on such fabrics; NVLink 3 (A100: 600 GB/s both ways,
300 GB/s each way, NVIDIA A100 datasheet) with ~1 us inside a node.
Taught in `notebooks/12_scalability.ipynb`.
"""
from __future__ import annotations

import math
from ddnb._checks import Checks
from ddnb.cost.alpha_beta import ALGORITHMS, allreduce_time
from ddnb.emulate.profile import Link


Network = Link   # a network is the emulator's Link: alpha (s), bandwidth (bytes/s), name


def network(bandwidth_gbps: float, latency_us: float, name: str | None = None) -> Network:
    """A Link of bandwidth_gbps Gb/s (bandwidth_gbps / 8 GB/s) and latency_us us a message,
    validated."""
    with Checks("network") as check:
        check.number("bandwidth_gbps", bandwidth_gbps, positive=True)
        check.number("latency_us", latency_us, min=0)
    return Link(latency_us * 1e-6, bandwidth_gbps * 1e9 / 8, name or f"{bandwidth_gbps:g} Gb/s, {latency_us:g} us")


NETWORKS = {  # illustrative, see the module docstring
    "100G Ethernet": network(100, 5, "100 Gb/s, 5 us"),
    "400G InfiniBand": network(400, 2, "400 Gb/s, 2 us"),
}
NVLINK = Link(1e-6, 300e9, "NVLink 300 GB/s, 1 us")
STEP_ALGORITHMS = ("ps_central", "ps_sharded", "tree", "ring", "halving_doubling", "hierarchical", "torus2d")


# ---------------------------------------------------------------- validation
def _link(check: Checks, name: str, net) -> None:
    """`net` a Link with a bandwidth > 0 and an alpha >= 0."""
    if check.rule(isinstance(net, Link), f"{name}={net!r}: need a ddnb.emulate.Link (see network(...))"):
        check.number(f"{name}.bandwidth", net.bandwidth, positive=True, why=" (bytes/s)")
        check.number(f"{name}.alpha", net.alpha, min=0, why=" (seconds)")


def _link_costs(check: Checks, **values) -> None:
    """Each of alpha, beta, gamma (seconds per message / per byte) a number >= 0."""
    for name, v in values.items():
        check.number(name, v, min=0)


# ---------------------------------------------------------------- the schemes
def parameter_server_time(nbytes: float, workers: int, alpha: float, beta: float, gamma: float = 0.0,
                          servers: int = 1) -> float:
    """Seconds of one push (gradients) and pull (parameters) of `nbytes` per worker, with
    the parameters split evenly over `servers` servers on their own links (Li et al. 2014).

    Server j receives N messages of S/k bytes one after another, sums them, and sends N
    back: 2N(alpha + S/k beta) + N S/k gamma. A worker sends k messages and receives k,
    2k alpha + 2 S beta in all; the step waits for the slower of the two links.
    servers=1 is the central server: 2N(alpha + S beta) + N S gamma, its link carrying
    2 N S bytes (`ddnb.parameter_server.sharded.bytes_per_step`)."""
    with Checks("parameter_server_time") as check:
        check.number("nbytes", nbytes, min=0)
        check.positive_ints(workers=workers, servers=servers)
        _link_costs(check, alpha=alpha, beta=beta, gamma=gamma)
    n, k, s = workers, servers, float(nbytes)
    server_link = 2 * n * (alpha + s / k * beta) + n * s / k * gamma
    worker_link = 2 * k * alpha + 2 * s * beta
    return max(server_link, worker_link)


def hierarchical_allreduce_time(nbytes: float, workers: int, per_node: int, intra: Network, inter: Network,
                                gamma: float = 0.0, inter_algorithm: str = "ring") -> float:
    """Seconds of a two-level all-reduce of `nbytes` on `workers` = m nodes x g = `per_node`:

    1. reduce-scatter in each node (ring of g on `intra`): (g-1) a_in + (g-1)/g S (b_in + gamma)
    2. all-reduce of the S/g bytes each worker now owns, with its peers of the same local
       rank in the other m-1 nodes (`inter_algorithm` on `inter`; the g such all-reduces
       run at once, one per local rank: one NIC per GPU, as on DGX nodes)
    3. all-gather in each node: (g-1) a_in + (g-1)/g S b_in

    Goyal et al. 2017 (Section 4: reduce in the server, halving-doubling across servers,
    broadcast back), Jia et al. 2018 (their "hierarchical all-reduce"), NCCL's
    trees/rings across nodes. One node (m = 1): the flat ring on `intra`; one worker per
    node (g = 1): the flat `inter_algorithm` on `inter`."""
    with Checks("hierarchical_allreduce_time") as check:
        check.number("nbytes", nbytes, min=0)
        if check.positive_ints(workers=workers, per_node=per_node):
            check.rule(workers % per_node == 0, f"workers={workers} is not a whole number of nodes of "
                       f"per_node={per_node} (need workers % per_node == 0, got remainder {workers % per_node})")
        _link(check, "intra", intra)
        _link(check, "inter", inter)
        check.number("gamma", gamma, min=0)
        check.rule(inter_algorithm in ALGORITHMS,
                   f"unknown inter_algorithm {inter_algorithm!r}; known: {', '.join(ALGORITHMS)}")
    return _two_level(float(nbytes), per_node, workers // per_node, intra.alpha, intra.beta, inter.alpha,
                      inter.beta, gamma, inter_algorithm)


def _two_level(s: float, g: int, m: int, a_in: float, b_in: float, a_out: float, b_out: float, gamma: float,
               inter_algorithm: str = "ring") -> float:
    """Reduce-scatter in groups of g, all-reduce of s/g across the m groups, all-gather."""
    in_group = 0.0
    if g > 1:
        in_group = 2 * (g - 1) * a_in + 2 * (g - 1) / g * s * b_in + (g - 1) / g * s * gamma
    return in_group + allreduce_time(inter_algorithm, s / g, m, a_out, b_out, gamma)


def grid_shape(workers: int) -> tuple[int, int]:
    """(rows, cols) of the squarest power-of-two grid of `workers` (a power of two):
    rows = 2^floor(k/2), cols = 2^ceil(k/2) for workers = 2^k (8 -> (2, 4), 4096 -> (64, 64))."""
    with Checks("grid_shape") as check:
        if check.integer("workers", workers, min=1):
            check.rule(workers & (workers - 1) == 0, f"workers={workers} is not a power of two: a 2D grid needs "
                       f"one here (pass rows and cols with rows * cols == workers to torus2d_allreduce_time)")
    k = workers.bit_length() - 1
    return 1 << (k // 2), 1 << (k - k // 2)


def torus2d_allreduce_time(nbytes: float, rows: int, cols: int, alpha: float, beta: float,
                           gamma: float = 0.0) -> float:
    """Seconds of the 2D-torus all-reduce on a rows x cols grid (Mikami et al. 2018):
    reduce-scatter along each row (ring of cols), all-reduce of the S/cols bytes each worker
    owns along each column (ring of rows), all-gather along each row:

        2(cols-1) alpha + 2(rows-1) alpha  +  2(p-1)/p S beta  +  (p-1)/p S gamma,  p = rows cols

    the ring's bytes with 2(rows + cols - 2) messages instead of 2(p-1): about 4 sqrt(p)."""
    with Checks("torus2d_allreduce_time") as check:
        check.number("nbytes", nbytes, min=0)
        check.positive_ints(rows=rows, cols=cols)
        _link_costs(check, alpha=alpha, beta=beta, gamma=gamma)
    return _two_level(float(nbytes), cols, rows, alpha, beta, alpha, beta, gamma)


def ring_latency_takeover(nbytes: float, alpha: float, beta: float) -> int:
    """Smallest N >= 2 at which the ring's latency term 2(N-1) alpha is at least its
    bandwidth term 2(N-1)/N n beta, i.e. N >= n beta / alpha."""
    with Checks("ring_latency_takeover") as check:
        check.number("nbytes", nbytes, min=0)
        check.number("alpha", alpha, positive=True)
        check.number("beta", beta, min=0)
    return max(2, math.ceil(nbytes * beta / alpha * (1 - 1e-12)))


# ---------------------------------------------------------------- a training step
def communication_time(algorithm: str, num_params: float, workers: int, net: Network, bytes_per_param: float = 4,
                       gamma: float = 0.0, bucket_bytes: float | None = None, servers: int = 1,
                       per_node: int = 8, intra: Network = NVLINK, inter_algorithm: str = "ring") -> float:
    """Seconds one step spends synchronizing the gradients of `num_params` parameters
    (`bytes_per_param` each: 4 fp32, 2 fp16) on `workers` workers with `algorithm` (one of
    STEP_ALGORITHMS) over `net`. bucket_bytes: send the gradient as ceil(S/bucket) equal
    all-reduces (None: one). servers: for ps_sharded. per_node, intra, inter_algorithm:
    for hierarchical (one node when workers <= per_node; otherwise workers must be a
    multiple of it; `net` is then the network between nodes)."""
    with Checks("communication_time") as check:
        check.rule(algorithm in STEP_ALGORITHMS,
                   f"unknown algorithm {algorithm!r}; known: {', '.join(STEP_ALGORITHMS)}")
        check.positive_numbers(num_params=num_params, bytes_per_param=bytes_per_param)
        check.number("bucket_bytes", bucket_bytes, positive=True, none=True)
        # servers and per_node are checked whatever the algorithm: a bad value is never ignored
        check.positive_ints(workers=workers, servers=servers, per_node=per_node)
        _link(check, "net", net)
        _link(check, "intra", intra)
        check.number("gamma", gamma, min=0)
        check.rule(inter_algorithm in ALGORITHMS,
                   f"unknown inter_algorithm {inter_algorithm!r}; known: {', '.join(ALGORITHMS)}")
    s = num_params * bytes_per_param
    buckets = 1 if bucket_bytes is None else math.ceil(s / bucket_bytes)
    n = s / buckets
    a, b = net.alpha, net.beta
    if algorithm in ("ps_central", "ps_sharded"):
        k = 1 if algorithm == "ps_central" else servers
        return buckets * parameter_server_time(n, workers, a, b, gamma, servers=k)
    if workers == 1:
        return 0.0
    if algorithm == "hierarchical":
        g = min(per_node, workers)
        return buckets * hierarchical_allreduce_time(n, workers, g, intra, net, gamma, inter_algorithm)
    if algorithm == "torus2d":
        return buckets * torus2d_allreduce_time(n, *grid_shape(workers), a, b, gamma)
    return buckets * allreduce_time(algorithm, n, workers, a, b, gamma)


def step_time(algorithm: str, num_params: float, workers: int, compute_time: float, net: Network,
              overlap: bool = False, **kwargs) -> float:
    """Seconds of one weak-scaling step: compute_time + communication_time(...), or their
    max with overlap=True (communication hidden behind backward, the best case)."""
    with Checks("step_time") as check:
        check.number("compute_time", compute_time, min=0)
    comm = communication_time(algorithm, num_params, workers, net, **kwargs)
    return max(compute_time, comm) if overlap else compute_time + comm


def compute_time(flops_per_step: float, peak_flops: float, utilization: float = 0.4) -> float:
    """Seconds of compute per step on one worker: flops / (peak x utilization). For a
    transformer, flops ~ 6 x parameters x tokens (Kaplan et al. 2020, Section 2.1)."""
    with Checks("compute_time") as check:
        check.positive_numbers(flops_per_step=flops_per_step, peak_flops=peak_flops)
        check.number("utilization", utilization, positive=True, max=1)
    return flops_per_step / (peak_flops * utilization)


def step_times(algorithms, workers, num_params: float, compute_time: float, net: Network,
               **kwargs) -> dict[str, dict[int, float]]:
    """{algorithm: {N: step seconds}} for each algorithm and worker count (kwargs: step_time's)."""
    return {a: {n: step_time(a, num_params, n, compute_time, net, **kwargs) for n in workers} for a in algorithms}


def efficiency(times: dict[int, float], compute_time: float) -> dict[int, float]:
    """{N: T(1) / T(N)} for weak scaling, with T(1) = compute_time (one worker talks to no one)."""
    with Checks("efficiency") as check:
        check.number("compute_time", compute_time, positive=True)
    return {n: compute_time / t for n, t in times.items()}


def crossover(first, second, workers) -> int | None:
    """The first N of `workers` (ascending) at which first(N) < second(N), or None.
    first, second: callables N -> seconds, e.g. lambda n: allreduce_time("tree", S, n, a, b)."""
    for n in sorted(workers):
        if first(n) < second(n):
            return n
    return None
