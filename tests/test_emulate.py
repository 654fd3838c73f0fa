"""The emulated cluster (ddnb.emulate): messages take alpha + n/B of their link, one rank's
sends share its link, compute takes its roofline time, results are bit-identical to real
mode, overruns are reported, and bad profiles fail before any process starts.

Times here are emulated, so they do not depend on this machine's speed; the profile's
alpha and slowdown are large enough (20 ms of real time per message) that the real work
fits inside them on a quiet machine. A rank that wakes late (a lag) changes no emulated
time in a rank whose clock only its own thread moves (tested below at slowdown 1e-6);
where a second thread moves it, a lag is an overrun, which only ever adds time, so the
checks below allow a time above its model by at most the overruns of all ranks during
the run (`on_model`).
Speed targets live in the benchmarks."""
import psutil
import pytest
import torch

from ddnb import emulate
from ddnb.collectives import ALLREDUCES
from ddnb.emulate import PROFILES, Link, Profile, custom, get_profile
from ddnb.testing import World

ALPHA, BW, PEAK = 1e-3, 1e8, 1e9     # 1 ms, 100 MB/s, 1 GFLOP/s; x slowdown 20 = 20 ms real per message
SLOW = custom(alpha=ALPHA, bandwidth=BW, peak_flops=PEAK, efficiency=1.0, memory_bandwidth=1e12, slowdown=20)


def overran(w, fn, *args):
    """fn(*args) on every rank of `w`, and the emulated seconds all ranks overran meanwhile."""
    before = sum(r["overrun_time"] for r in w.emulation_reports())
    out = w.run(fn, *args)
    return out, sum(r["overrun_time"] for r in w.emulation_reports()) - before


def on_model(got: float, model: float, late: float, rel: float) -> bool:
    """`got` is the model's time give or take `rel`, plus at most `late` seconds of overruns
    (within `rel` of the model when nothing overran)."""
    return model * (1 - rel) <= got <= model * (1 + rel) + late


@pytest.fixture(scope="module")
def world():
    with World(3, emulate=SLOW, timeout=120) as w:
        yield w


def _pingpong(nbytes):
    import torch.distributed as dist

    from ddnb.collectives import p2p
    from ddnb.emulate import current, messages

    x, em = torch.zeros(nbytes // 4), current()
    messages.barrier()
    t0 = em.now()
    if dist.get_rank() == 0:
        p2p.send(x, 1)
        p2p.recv(x, 1)
    elif dist.get_rank() == 1:
        p2p.recv(x, 0)
        p2p.send(x, 0)
    return (em.now() - t0) / 2


@pytest.mark.parametrize("nbytes", [4, 400_000])
def test_a_message_takes_alpha_plus_n_over_b(world, nbytes):
    (one_way, *_), late = overran(world, _pingpong, nbytes)
    assert on_model(one_way, ALPHA + nbytes / BW, late, rel=0.05)


def _two_sends(nbytes):
    import torch.distributed as dist

    from ddnb.collectives import p2p
    from ddnb.emulate import current, messages

    x, em = torch.zeros(nbytes // 4), current()
    t0 = messages.barrier()
    if dist.get_rank() == 0:
        for w in [p2p.isend(x, 1), p2p.isend(x, 2)]:
            w.wait()
    else:
        p2p.recv(x, 0)
    return em.t - t0


def test_sends_from_one_rank_share_its_link(world):
    n = 200_000
    (sender, first, second), late = overran(world, _two_sends, n)
    assert on_model(first, ALPHA + n / BW, late, rel=0.02)           # the first message has the link alone
    assert on_model(second, 2 * (ALPHA + n / BW), late, rel=0.02)    # the second waits for the first's alpha + n/B
    assert on_model(sender, 2 * (ALPHA + n / BW), late, rel=0.02)    # the sender's link is busy until then


def _matmul(m, k, n):
    from ddnb.emulate import current

    a, b, em = torch.randn(m, k), torch.randn(k, n), current()
    t0 = em.now()
    a @ b
    return em.now() - t0, em.report()["flops"]


def test_a_paced_matmul_takes_its_flops_over_peak(world):
    ((took, flops), *_), late = overran(world, _matmul, 64, 128, 96)
    assert flops >= 2 * 64 * 128 * 96
    assert on_model(took, 2 * 64 * 128 * 96 / PEAK, late, rel=0.05)


def _traced_matmul(m, k, n):
    from ddnb.trace import Tracer

    a, b, tracer = torch.randn(m, k), torch.randn(k, n), Tracer()
    with tracer.span("compute", "matmul"):
        a @ b
    (event,) = tracer.take()
    return event["end"] - event["start"]


def test_a_traced_span_is_stamped_in_emulated_time(world):
    """Trace events of an emulated worker are in its emulated seconds (what the timelines
    and idle fractions of the notebooks read), not this machine's."""
    assert world.run(_traced_matmul, 64, 128, 96)[0] == pytest.approx(2 * 64 * 128 * 96 / PEAK, rel=1e-6)


def _allreduce(algorithm, numel):
    import torch.distributed as dist

    from ddnb.collectives import ALLREDUCES

    x = torch.randn(numel, generator=torch.Generator().manual_seed(dist.get_rank()))
    ALLREDUCES[algorithm](x)
    return x


@pytest.mark.parametrize("algorithm", sorted(ALLREDUCES))
def test_results_are_bit_identical_to_real_mode(world, algorithm):
    with World(3) as real:
        expected = real.run(_allreduce, algorithm, 1001)
    got = world.run(_allreduce, algorithm, 1001)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))


def _matmul_then_ring(m, numel):
    """Emulated seconds of a matmul and a ring all-reduce between two barriers, and this
    rank's report."""
    from ddnb.collectives import ring_allreduce
    from ddnb.emulate import current
    from ddnb.timing import barrier_and_clock

    barrier, clock = barrier_and_clock()
    a, x = torch.randn(m, m), torch.ones(numel)
    barrier()
    t0 = clock()
    a @ a
    ring_allreduce(x)
    return clock() - t0, current().report()


def test_a_lag_changes_no_emulated_time_in_a_single_threaded_rank():
    # slowdown 1e-6: a microsecond of real work would need to take a picosecond, so every
    # sync lags; the times are the model's all the same, equal to a run at slowdown 20
    fast = SLOW.with_(slowdown=1e-6, name="too-fast")
    with World(3, emulate=fast, timeout=60) as w:
        lagged = w.run(_matmul_then_ring, 300, 30001)
        reports = w.emulation_reports()
    with World(3, emulate=SLOW, timeout=120) as w:
        paced = w.run(_matmul_then_ring, 300, 30001)
    assert all(r["lags"] >= 1 and r["overruns"] == 0 and not r["threaded"] for r in reports)
    # equal to the float precision of clocks that count from a real start (1e6 s at 1e-6)
    assert [t for t, _ in lagged] == pytest.approx([t for t, _ in paced], abs=1e-8)
    compute = 2 * 300 ** 3 / PEAK
    assert all(t > compute + 4 * ALPHA for t, _ in lagged)     # the ring's 2(N-1) messages, N = 3
    assert "no overruns" in emulate.summary(reports)


def test_an_overrun_is_reported_where_a_second_thread_moves_the_clock():
    import threading
    import time

    from ddnb.emulate import Emulator

    em = Emulator(SLOW, 0, 1, time.monotonic())
    em.charge(1e-4)                   # 2 real ms of modeled work ...
    time.sleep(0.05)                  # ... took 50: a lag, no emulated time changes
    em.sync()
    assert (em.lags, em.overruns, em.t) == (1, 0, pytest.approx(1e-4, abs=1e-3 / 20))
    thread = threading.Thread(target=em.advance_to, args=(em.t,))   # a communication thread
    thread.start()
    thread.join()
    em.charge(1e-4)
    time.sleep(0.05)                  # the two threads' order now follows real time: an overrun
    em.sync()
    # late by both sleeps: the first lag left the clock at its model
    assert em.threaded and em.overruns == 1 and em.overrun_time == pytest.approx(0.1 / 20 - 2e-4, abs=0.01 / 20)
    summary = emulate.summary([em.report()])
    assert "1 overruns in" in summary and "raise slowdown" in summary


def test_idle_time_between_tasks_is_not_a_lag():
    import time

    from ddnb.emulate import Emulator

    em = Emulator(SLOW, 0, 1, time.monotonic())
    time.sleep(0.05)                  # idle: 50 real ms, over the tolerance (0.5 alpha x 20 = 10 ms)
    em.resume()
    em.sync()
    assert em.lags == em.overruns == 0


@pytest.mark.parametrize("make, names", [
    (lambda: custom(alpha=-1, bandwidth=0), ["alpha=-1", "bandwidth=0"]),
    (lambda: SLOW.with_(slowdown=0), ["slowdown=0"]),
    (lambda: SLOW.with_(slowdown=-2, efficiency=1.5), ["slowdown=-2", "efficiency=1.5"]),
    (lambda: Profile("x", 1e12, 0.5, 1e12, Link(1e-6, -5), Link(1e-6, 1e9), 0), ["intra.bandwidth=-5",
                                                                               "ranks_per_host=0"]),
    (lambda: get_profile("infiniband"), ["'infiniband' is not a profile", "10gbe"]),
])
def test_bad_profiles_name_every_bad_field(make, names):
    with pytest.raises(ValueError) as e:
        make()
    assert all(n in str(e.value) for n in names), str(e.value)


def test_bad_profiles_fail_before_any_process_starts():
    from ddnb import Cluster

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    for make in (lambda: World(2, emulate="infiniband"), lambda: Cluster(n=2, emulate="infiniband"),
                 lambda: Cluster(n=2, emulate="ib", horovod=True)):
        with pytest.raises(ValueError, match="infiniband|not emulated"):
            make()
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before


def test_named_profiles_cite_their_sources():
    for name, p in emulate.PROFILES.items():
        assert p.name == name and ("datasheet" in p.source or "GbE" in p.source)
        assert name in str(p) and "emulated" in str(p)


def test_the_allreduce_bench_runs_emulated_and_says_so():
    """Rows in emulated seconds, labelled with the profile; torch's all-reduce charged the
    ring's alpha-beta time; the model fitted to the run's own point-to-point times."""
    from ddnb.bench.allreduce import allreduce_benchmark
    from ddnb.cost import allreduce_time

    rows, model = allreduce_benchmark(2, [4096, 65536], ["ring", "torch"], fit=True, emulate=SLOW, timeout=120)
    assert {r["emulated"] for r in rows} == {"custom"} and "emulated 'custom'" in model["emulation"]
    for r in rows:
        if r["algorithm"] == "torch":   # slower only when the row counted an overrun
            ring = allreduce_time("ring", r["size"], 2, ALPHA, 1 / BW, 0.0)
            assert r["time"] == pytest.approx(ring, rel=0.05) if r["overruns"] == 0 else r["time"] >= ring * 0.95
    # A row measured without an overrun is the profile's time exactly (emulated time is
    # computed, not read off a clock); an overrun (a hiccup of this machine longer than the
    # tolerance) only ever makes a row slower, and the model is fitted to the clean rows.
    for pattern, prs in model["p2p"].items():
        for r in prs:
            assert r["overruns"] is not None
            exact = ALPHA + r["size"] / BW
            assert r["time"] == pytest.approx(exact, rel=1e-6) if r["overruns"] == 0 else r["time"] >= exact * 0.999
    alpha, beta = model["alpha_beta"]["pingpong"]
    if len(model["fit_sizes"]["pingpong"]) < 4:
        assert "overruns in" in model["emulation"] and "raise slowdown" in model["emulation"]
    if all(r["overruns"] == 0 for r in model["p2p"]["pingpong"] if r["size"] in model["fit_sizes"]["pingpong"]):
        assert alpha == pytest.approx(ALPHA, rel=1e-4) and beta == pytest.approx(1 / BW, rel=1e-4)
    else:   # too few clean sizes: every row was slowed, so the fit is too, and says so
        assert "raise slowdown" in model["emulation"]
    with pytest.raises(ValueError, match="Horovod is not emulated"):
        allreduce_benchmark(2, [4096], ["horovod"], emulate=SLOW)


def test_an_emulated_pipeline_shows_the_bubble_of_the_formula():
    """Each stage computes on a device of its own in emulated time, so GPipe's measured
    bubble approaches (p-1)/(m+p-1) (messages are nearly free on this profile); the same
    model in real mode on shared cores is not asked to."""
    from ddnb.bench.pipeline import pipeline_benchmark

    device = custom(alpha=1e-7, bandwidth=1e12, peak_flops=1e9, efficiency=1.0, memory_bandwidth=1e12,
                    slowdown=300)
    rows, emulation = pipeline_benchmark(2, [1, 4], ["gpipe"], emulate=device, width=64, microbatch_size=4,
                                         timeout=120)
    assert [r["emulated"] for r in rows] == ["custom", "custom"]
    for r in rows:
        assert abs(r["bubble"] - r["analytic"]) < 0.05, (r, emulation)
    assert rows[1]["bubble"] < rows[0]["bubble"] - 0.2     # 0.5 -> 0.2 on paper


def test_the_pipeline_bench_measures_every_schedule_with_its_model_and_memory():
    """Every schedule, zero-bubble ones too, on 2 emulated stages (m = 4): the measured
    bubble beside the formula (GPipe, 1F1B, interleaved, ZB-H1) or the checker's unit-cost
    bubble (ZB-V, DualPipeV) within 0.1 (measured 0.04 to 0.08 above it: with p = 2 the
    first stage's empty B and whole-backward W, and the last stage's loss, which the models
    leave out, weigh a lot), the most micro-batches a rank held (measured, as the checker
    says), the step's span in emulated seconds; ZB-H1 idles less than 1F1B."""
    from ddnb.bench.pipeline import SCHEDULES, pipeline_benchmark, pipeline_table
    from ddnb.pipeline_parallel import get_schedule, validate_schedule

    device = custom(alpha=1e-7, bandwidth=1e12, peak_flops=1e9, efficiency=1.0, memory_bandwidth=1e12,
                    slowdown=300)
    rows, emulation = pipeline_benchmark(2, [4], SCHEDULES, emulate=device, width=64, microbatch_size=4,
                                         timeout=120, steps=1)
    assert "no overruns" in emulation
    by = {r["schedule"]: r for r in rows}
    assert list(by) == list(SCHEDULES)
    for name, r in by.items():
        assert {"schedule", "stages", "microbatches", "bubble", "analytic", "peak_activations",
                "step_time"} <= set(r) and r["emulated"] == "custom"
        assert r["analytic_from"] == ("checker" if name in ("zbv", "dualpipev") else "formula")
        report = validate_schedule(get_schedule(name, 2, 4), 4)
        assert r["in_flight"] == report.peak_in_flight and r["peak_activations"] == max(report.peak_in_flight)
        assert 0 < r["step_time"] < 1 and 0 < r["bubble"] < 1
        assert abs(r["bubble"] - r["analytic"]) < 0.1, (name, r, emulation)
    assert by["zbh1"]["analytic"] == pytest.approx(1 / 13)          # (p-1)/(3m+p-1)
    assert by["zbh1"]["bubble"] < by["1f1b"]["bubble"] - 0.05
    assert "zbh1" in pipeline_table(rows)


def test_pipeline_bench_cli_takes_every_schedule_and_skips_what_one_cannot_run(capsys):
    import json

    from ddnb.bench.__main__ import main

    assert main(["pipeline", "--schedule", "gpipe,1f1b,interleaved,zbh1,zbv,dualpipev", "--stages", "2",
                 "--microbatches", "3,4", "--width", "64", "--microbatch-size", "2", "--emulate", "ib",
                 "--json"]) == 0
    out = capsys.readouterr()
    rows = json.loads(out.out)
    assert [(r["schedule"], r["microbatches"]) for r in rows] == [
        ("gpipe", 3), ("gpipe", 4), ("1f1b", 3), ("1f1b", 4), ("interleaved", 4), ("zbh1", 3), ("zbh1", 4),
        ("zbv", 3), ("zbv", 4), ("dualpipev", 4)]
    assert "interleaved: m = 3 skipped (needs m a multiple of stages(2))" in out.err
    assert "dualpipev: m = 3 skipped (needs m >= 2 x stages(2))" in out.err and "no overruns" in out.err
    assert all(r["emulated"] == "ib" and "events" not in r for r in rows)


def test_pipeline_bench_argument_errors_before_any_process(capsys):
    from ddnb.bench.__main__ import main

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    for argv, message in ((["pipeline", "--stages", "1"], "--stages"), (["pipeline", "--schedules", "zigzag"], "zigzag"),
                          (["pipeline", "--microbatches", "0"], "--microbatches"),
                          (["pipeline", "--schedule", "dualpipev", "--microbatches", "4,6"],
                           "dualpipev can run none of --microbatches 4,6: needs m >= 2 x stages(4)"),
                          (["pipeline", "--slowdown", "10"], "--slowdown needs --emulate")):
        with pytest.raises(SystemExit):
            main(argv)
        assert message in capsys.readouterr().err
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before


@pytest.mark.parametrize("strategy", ["naive", "bucketed", "ddp"])
def test_data_parallel_runs_emulated_with_the_same_gradients(strategy):
    """naive, bucketed and DDP in an emulated cluster: the same parameters after a step as
    in real mode (bit-identical), and a step time in emulated seconds."""
    from ddnb.bench.dp import dp_benchmark

    def params_after_step(strategy):
        import torch.nn.functional as F

        from ddnb.bench.dp import bench_model, wrap

        model, opt, sync = wrap(strategy, bench_model("many_small", width=16, layers=3))
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(__import__("torch.distributed").distributed
                                                                          .get_rank()))
        F.mse_loss(model(x), x).backward()
        sync()
        opt.step()
        return [p.detach().clone() for p in model.parameters()]

    with World(2) as real:
        expected = real.run(params_after_step, strategy)
    with World(2, emulate=SLOW) as emulated:
        got = emulated.run(params_after_step, strategy)
    assert all(torch.equal(a, b) for r, e in zip(got, expected) for a, b in zip(r, e))
    rows = dp_benchmark(2, ["many_small"], [strategy], steps=2, warmup=1, rounds=1, emulate=SLOW, timeout=120,
                        width=16, layers=3)
    assert rows[0]["emulated"] == "custom" and rows[0]["step_time"] > 2 * ALPHA   # at least one all-reduce's latency


def test_named_profiles_scale_their_slowdown_with_workers_per_core():
    """A named profile's default slowdown is at least its own scaled by workers per core
    (`scaled_slowdown`), and more where this machine's calibration needs more
    (`default_slowdown`; tests/test_calibrate.py checks that rule)."""
    import os

    from ddnb.runtime.placement import default_slowdown, emulated_profile, scaled_slowdown
    from ddnb._checks import Checks

    assert scaled_slowdown(500, 16, cores=2) == 4000 and scaled_slowdown(500, 1, cores=2) == 500
    cores = len(os.sched_getaffinity(0))
    check = Checks("t")
    got = emulated_profile("ib", check, workers=4 * cores).slowdown
    assert got == default_slowdown(PROFILES["ib"], 4 * cores) >= 4 * PROFILES["ib"].slowdown
    custom_profile = PROFILES["ib"].with_(slowdown=7.0)
    assert emulated_profile(custom_profile, check, workers=4 * cores).slowdown == 7.0   # a Profile is used as given
    check.done()


def test_a_world_switches_profile_and_back_to_real_mode():
    """World.emulate_as: the same processes become another emulated cluster (a ping-pong
    then takes the new link's alpha + n/B), and None is real mode again."""
    from ddnb.emulate import current

    fast = custom(alpha=ALPHA / 2, bandwidth=BW * 4, peak_flops=PEAK, efficiency=1.0, memory_bandwidth=1e12,
                  slowdown=20, name="fast")
    with World(2, emulate=SLOW, timeout=120) as w:
        (one_way, *_), late = overran(w, _pingpong, 400_000)
        assert on_model(one_way, ALPHA + 400_000 / BW, late, rel=0.05)
        w.emulate_as(fast)
        assert w.emulate.name == "fast" and w.run(lambda: current().profile.name) == ["fast", "fast"]
        (one_way, *_), late = overran(w, _pingpong, 400_000)
        assert on_model(one_way, ALPHA / 2 + 400_000 / (4 * BW), late, rel=0.05)
        w.emulate_as(None)
        assert w.emulate is None and w.run(lambda: current() is None) == [True, True]
        with pytest.raises(ValueError, match="slowdown"):
            w.emulate_as(fast.with_(slowdown=0))
        assert w.run(lambda: current() is None) == [True, True]   # a bad profile changed nothing


def test_overlap_by_profile_labels_each_run_and_refuses_bad_names_first():
    """One row per profile, in order, each with the run's overlap and the model's; an
    unknown profile is named before any process starts."""
    from ddnb.bench.dp import overlap_by_profile

    before = set(psutil.Process().children(recursive=True))
    with pytest.raises(ValueError, match="'nope' is not a profile"):
        overlap_by_profile([SLOW, "nope"], workers=2)
    assert set(psutil.Process().children(recursive=True)) == before
    fast = SLOW.with_(name="fast", bandwidth=BW * 100, alpha=ALPHA / 10)
    rows = overlap_by_profile([SLOW, fast], workers=2, batch=8, bucket_mb=0.01, steps=1, warmup=1, rounds=1,
                              width=32, layers=2)
    assert [r["emulated"] for r in rows] == ["custom", "fast"] and all(r["strategy"] == "bucketed" for r in rows)
    for r in rows:
        assert 0 <= r["overlap"] <= 1 and 0 <= r["model_overlap"] <= 1 and r["emulation"].startswith("emulated")
    assert rows[1]["step_time"] < rows[0]["step_time"]      # the faster link's step is shorter


def test_the_parameter_server_is_refused_in_an_emulated_cluster_on_every_rank(monkeypatch):
    """Its server receives from any source, which the emulated message layer does not
    carry: every rank says so before any message, none blocks. (A rank that blocked would
    still be listed as blocked after the grace, which is long here so that a slow rank on a
    loaded machine is not mistaken for a blocked one.)"""
    monkeypatch.setattr("ddnb.runtime.world.ERROR_GRACE_SECONDS", 30.0)
    from functools import partial

    from ddnb.runtime.errors import WorkerError

    def run():
        from ddnb.data import digits
        from ddnb.models import mlp
        from ddnb.parameter_server import PSConfig, train

        train_set, _ = digits(seed=0)
        return train(PSConfig(servers=1, mode="bsp", steps=2, batch_size=8), partial(mlp, (64, 8, 10), seed=0), train_set)

    with World(3, emulate=SLOW, timeout=60) as w:
        with pytest.raises(WorkerError, match=r"(?s)ranks \[0, 1, 2\] raised.*parameter server is not emulated"):
            w.run(run)


def _raw_and_layer_calls():
    import torch.distributed as dist

    from ddnb.emulate import messages, report

    messages.barrier()                    # the emulated layer's: timed, not counted
    x = torch.ones(4)
    messages.all_reduce(x)
    dist.barrier()                        # raw torch.distributed: real, untimed, counted
    dist.all_reduce(x)
    return report()["unmodeled"]


def test_torch_distributed_calls_outside_the_emulated_layer_are_named_in_the_summary():
    """A raw dist.barrier() takes no emulated time: the run says so instead of printing a
    time that silently left it out."""
    from ddnb.emulate import summary

    with World(2, emulate=SLOW, timeout=60) as w:
        assert w.run(_raw_and_layer_calls) == [{"barrier": 1, "allreduce_": 1}] * 2
        line = summary(w.emulation_reports())
    assert "outside ddnb's emulated layer took no emulated time (allreduce_ x2, barrier x2" in line


def _gather_and_ops(nbytes):
    import torch.distributed as dist

    from ddnb.emulate import current, messages

    em = current()
    x = torch.ones(nbytes // 4)
    out = torch.empty(dist.get_world_size() * x.numel())
    t0 = messages.barrier()
    messages.all_gather(out, x)
    end = em.now()
    x + 1                                    # one elementwise op: roofline bytes + the launch overhead
    return t0, end, em.now() - end, bool(torch.equal(out, torch.ones_like(out)))


def test_an_all_gather_takes_the_rings_time_and_each_op_its_launch_overhead():
    """messages.all_gather: its ring's N-1 steps of alpha + S/B each, from the last rank's
    start to the last rank's end (a dissemination barrier's ranks leave it at different
    times); a profile's op_overhead is added to every charged operation."""
    n, nbytes, overhead = 3, 100_000, 2e-3
    with World(n, emulate=SLOW.with_(op_overhead=overhead), timeout=60) as w:
        ranks, late = overran(w, _gather_and_ops, nbytes)
        gathered = max(end for _, end, _, _ in ranks) - max(t0 for t0, _, _, _ in ranks)
        assert on_model(gathered, (n - 1) * (ALPHA + nbytes / BW), late, rel=1e-9)
        for _, _, op, ok in ranks:
            assert ok and on_model(op, overhead + 3 * nbytes / 1e12, late, rel=0.02)
    with pytest.raises(ValueError, match="op_overhead"):
        SLOW.with_(op_overhead=-1.0)


def test_an_emulated_world_runs_on_gloo_whatever_was_asked():
    with pytest.warns(UserWarning, match="emulated cluster runs on gloo"):
        with World(2, backend="nccl", emulate=SLOW, timeout=60) as w:
            assert w.backend == "gloo" and w.run(lambda: 1) == [1, 1]


def test_the_tolerance_is_half_an_alpha_and_lateness_under_it_is_a_distribution():
    """A sync later than half the profile's smallest alpha is a lag; one under it is only
    recorded in the lateness distribution (SLOW: alpha 1 ms, slowdown 20: 10 real ms)."""
    import time

    from ddnb.emulate import Emulator, lateness

    em = Emulator(SLOW, 0, 1, time.monotonic())
    assert em.tolerance == pytest.approx(0.5 * ALPHA)
    em.sync()                                    # on time
    time.sleep(0.004)                            # 4 real ms = 0.2 emulated ms late: under the tolerance
    em.sync()
    assert em.lags == 0
    time.sleep(0.03)                             # 30 real ms = 1.5 emulated ms: a lag
    em.sync()
    assert (em.lags, em.overruns) == (1, 0)
    stats = lateness([em.report()])
    assert stats["syncs"] == 3 and stats["lags"] == 1 and stats["tolerance"] == pytest.approx(0.5 * ALPHA)
    assert 0.2e-3 <= stats["p50"] < 0.5 * ALPHA and stats["max"] >= 1.5e-3
