"""ddnb.parameter_server against single-process SGD on the concatenated batches (BSP,
sharded, co-located, checkpointed), the consistency guarantees read back from the
recorded versions (ASP loses no update, SSP(s) stays within its bound, a straggler's
gradients go stale), the bytes each rank moves, lost workers (no hang, the rank named),
bad configurations (raised before any message), and digits to >= 95 % test accuracy.

Worlds: world(5) = 1 server + 4 workers (or 2 + 3), world(4) = 1 + 3 or 4 co-located.
"""
import functools
import math
import queue
import re
import threading
import time
import types
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from ddnb.cost import allreduce_bytes_per_rank
from ddnb.data import digits
from ddnb.runtime.errors import WorkerError
from ddnb.models import accuracy, flat_params, mlp
from ddnb.parameter_server import (PSConfig, Server, assemble, bound, bytes_per_step, checkpoint_file,
                                   final_params, may_proceed, shard_parameters, staleness_bound, traffic, train,
                                   train_allreduce, train_on_cluster, worker_batch)
from ddnb.parameter_server.messages import HEADER_BYTES, PUSH, decode, header
from ddnb.trace import take_events

MODEL = functools.partial(mlp, (64, 128, 10), seed=0)
S = 9610 * 4                     # bytes of the MLP's flat parameter vector
H = HEADER_BYTES


@pytest.fixture(scope="module")
def splits():
    return digits()


def reference(config: PSConfig, dataset, num_workers: int, steps: int) -> torch.Tensor:
    """Single-process SGD: each step, one optimizer step on the N workers' batches concatenated."""
    model = MODEL()
    opt = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
    for t in range(steps):
        xs, ys = zip(*(worker_batch(dataset, w, num_workers, config.batch_size, t, config.seed)
                       for w in range(num_workers)))
        opt.zero_grad()
        F.cross_entropy(model(torch.cat(xs)), torch.cat(ys)).backward()
        opt.step()
    return flat_params(model)


def servers_of(results):
    return [r for r in results if r["role"] in ("server", "colocated")]


def workers_of(results):
    return [r for r in results if r["role"] in ("worker", "colocated")]


def max_diff(a, b):
    return (a - b).abs().max().item()


BSP = PSConfig(mode="bsp", steps=20, batch_size=16, lr=0.1, momentum=0.9, seed=3)


# ---------------------------------------------------------------- no processes
def test_partition_by_layer_and_by_bytes():
    model = MODEL()
    layer, by_bytes = shard_parameters(model, 2, "layer"), shard_parameters(model, 2, "bytes")
    assert [(s.start, s.stop) for s in layer] == [(0, 8320), (8320, 9610)]          # whole Linear layers
    assert layer[0].names == ("0.weight", "0.bias") and layer[1].names == ("2.weight", "2.bias")
    assert [(s.start, s.stop) for s in by_bytes] == [(0, 4805), (4805, 9610)]       # near-equal halves
    assert by_bytes[0].names == ("0.weight",) and by_bytes[1].names[0] == "0.weight"
    deep = shard_parameters(mlp((64, 32, 32, 32, 10)), 3, "layer")   # layers of 2080, 1056, 1056, 330
    assert [s.numel for s in deep] == [2080, 1056, 1386]      # the largest shard as small as can be
    for k in (1, 3, 7):
        parts = shard_parameters(model, k, "bytes")
        assert parts[0].start == 0 and parts[-1].stop == 9610
        assert all(a.stop == b.start for a, b in zip(parts, parts[1:]))
        assert max(p.numel for p in parts) - min(p.numel for p in parts) <= 1
    with pytest.raises(ValueError, match="2 layers .* k=3"):
        shard_parameters(model, 3, "layer")
    with pytest.raises(ValueError, match="by="):
        shard_parameters(model, 2, "rows")


def test_train_on_cluster_names_the_straggler_and_validates_before_resizing():
    class FakeCluster:
        def __init__(self):
            self.calls = []

        def resize(self, n):
            self.calls.append(("resize", n))

        def run(self, fn, *args):
            self.calls.append(("run", fn, args))
            return ["per-rank dicts"]

    c = FakeCluster()
    out = train_on_cluster(c, MODEL, "data", workers=3, servers=2, mode="asp", straggler_delay=0.01, steps=5, lr=0.05)
    assert out == ["per-rank dicts"]
    assert c.calls == [("resize", 5), ("run", train, (PSConfig(servers=2, mode="asp", straggler_rank=4,
                                                               straggler_delay=0.01, steps=5, lr=0.05), MODEL, "data"))]
    c = FakeCluster()
    with pytest.raises(ValueError, match="staleness=2 is only used by mode='ssp'"):
        train_on_cluster(c, MODEL, "data", workers=2, staleness=2)
    assert c.calls == []                     # nothing resized or run


def test_consistency_rule_and_bounds():
    assert bound("bsp") == 0 and bound("ssp", 3) == 3 and bound("asp") == math.inf
    clocks = {1: 5, 2: 3, 3: 4}
    assert may_proceed(5, clocks, [1, 2, 3], 2) and not may_proceed(5, clocks, [1, 2, 3], 1)
    assert may_proceed(5, clocks, [1, 3], 1)                  # a lost worker leaves the min
    assert may_proceed(9, clocks, [], 0)
    assert staleness_bound(4, 0) == 3 and staleness_bound(4, 2) == 15
    with pytest.raises(ValueError, match="mode"):
        bound("sync")


def test_header_and_traffic():
    m = decode(header(PUSH, clock=7, version=2 ** 40, loss=0.25, arg=3))
    assert m == {"kind": "push", "clock": 7, "version": 2 ** 40, "loss": 0.25, "arg": 3}
    events = [{"rank": 1, "kind": "send", "name": "push", "nbytes": 10},
              {"rank": 0, "kind": "recv", "name": "push", "nbytes": 10},
              {"rank": 0, "kind": "compute", "name": "update", "nbytes": 0}]
    t = traffic(events, 2)
    assert t["sent"] == [0, 10] and t["received"] == [10, 0] and t["by_name"]["push"]["received"] == [10, 0]
    assert bytes_per_step(S, 4, 2) == {"server_sent": 2 * S, "server_received": 2 * S,
                                       "worker_sent": S, "worker_received": S}
    assert bytes_per_step(S, 4, colocated=True)["worker_sent"] == 3 * S / 4


class FakeWire:
    """Stands in for p2p.irecv / p2p.recv on a pure nccl group (no GPU here): a posted
    header receive from src completes once the test has `land`ed src's next message."""

    def __init__(self, messages):
        self.queued = {src: list(ms) for src, ms in messages.items()}   # src -> [(header, payload)]
        self.landed, self.posts = set(), []

    def irecv(self, tensor, src, group=None, tracer=None, name="recv"):
        self.posts.append(src)
        wire = self

        class Work:
            def is_completed(self):
                if src in wire.landed:
                    tensor.copy_(wire.queued[src][0][0])
                return src in wire.landed

            def wait(self):
                wire.landed.discard(src)

        return types.SimpleNamespace(work=Work(), start=time.time(), done=False)

    def recv(self, tensor, src, group=None, tracer=None, name="recv"):
        tensor.copy_(self.queued[src].pop(0)[1])

    def land(self, *srcs):
        self.landed.update(srcs)


def test_named_receiver_takes_first_come_in_turn_and_posts_only_when_nothing_is_owed(monkeypatch):
    """The server's receive on nccl (no any-source receive): one posted header receive per
    worker; the first complete is taken, ties in turn after the rank taken last; a
    worker's next receive is posted after its push, but after its pull only once it is
    answered (expect), since nccl would queue the answer behind that receive."""
    from ddnb.collectives import p2p
    from ddnb.parameter_server.messages import DONE, PULL, NamedReceiver
    from ddnb.trace import Tracer

    grad = torch.arange(3.0)
    wire = FakeWire({1: [(header(PULL), None), (header(PUSH, clock=0, loss=0.5), grad), (header(DONE), None)],
                     2: [(header(PULL), None)], 3: [(header(PULL), None)]})
    monkeypatch.setattr(p2p, "irecv", wire.irecv)
    monkeypatch.setattr(p2p, "recv", wire.recv)
    tracer = Tracer(rank=0)
    rx = NamedReceiver(None, 3, [1, 2, 3], tracer, device=torch.device("cpu"))
    assert wire.posts == [1, 2, 3]
    with pytest.raises(queue.Empty):
        rx.get(timeout=0.01)                                  # nothing landed: nothing taken
    wire.land(3, 1, 2)
    taken = [rx.get(timeout=1) for _ in range(3)]
    assert [(src, m["kind"]) for src, m, _ in taken] == [(1, "pull"), (2, "pull"), (3, "pull")]
    assert wire.posts == [1, 2, 3]                            # pulls are owed an answer: nothing posted
    wire.queued[1].pop(0)
    rx.expect(1)                                              # answered: listen again
    assert wire.posts == [1, 2, 3, 1]
    wire.land(1)
    src, m, payload = rx.get(timeout=1)
    assert (src, m["kind"], m["loss"]) == (1, "push", 0.5) and torch.equal(payload, grad)
    assert wire.posts == [1, 2, 3, 1, 1]                      # after a push: posted at once
    wire.land(1)
    assert rx.get(timeout=1)[1]["kind"] == "done" and rx.open == {2, 3}
    rx.expect(1)
    assert wire.posts == [1, 2, 3, 1, 1]                      # a finished worker is not listened to
    assert [(e["name"], e["peer"]) for e in tracer.events if e["kind"] == "recv"][:3] == \
        [("pull", 1), ("pull", 2), ("pull", 3)]


def test_server_state_dict_round_trip():
    a = Server(torch.arange(6.0), workers=[1, 2], lr=0.1, momentum=0.9, shard=1, bounds=(4, 10))
    a.apply(torch.ones(6))
    a.clocks[1] = 1
    b = Server(torch.zeros(6), workers=[1, 2], lr=0.1, momentum=0.9, shard=1, bounds=(4, 10))
    b.load_state_dict(a.state_dict())
    assert b.version == 1 and b.clocks == {1: 1, 2: 0} and torch.equal(b.params, a.params)
    a.apply(torch.ones(6))
    b.apply(torch.ones(6))                                    # momentum carried over
    assert torch.equal(b.params, a.params)
    with pytest.raises(ValueError, match=r"holds elements \(4, 10\)"):
        Server(torch.zeros(6), workers=[1, 2], lr=0.1, bounds=(0, 6)).load_state_dict(a.state_dict())


@pytest.mark.parametrize("kwargs, world_size, message", [
    (dict(servers=5), 5, r"servers=5 of world_size=5 leaves no worker"),
    (dict(servers=6), 5, r"servers=6 > world_size=5: more servers than ranks"),
    (dict(servers=0), 5, r"servers=0: need an integer >= 1"),
    (dict(mode="sync"), 5, r"mode='sync' is not one of"),
    (dict(mode="ssp", staleness=-1), 5, r"staleness=-1"),
    (dict(mode="bsp", staleness=2), 5, r"staleness=2 is only used by mode='ssp'"),
    (dict(colocated=True, mode="asp"), 4, r"colocated=True needs mode='bsp'"),
    (dict(colocated=True, servers=2), 4, r"every rank a server .*servers=2"),
    (dict(straggler_rank=0), 5, r"straggler_rank=0 is not a worker rank \(workers: \[1, 2, 3, 4\]\)"),
    (dict(straggler_rank=1, straggler_delay=2.0, worker_timeout=1.0), 5, r"straggler_delay=2.0 >= worker_timeout"),
    (dict(fail_rank=1, fail_after_steps=10, steps=10), 5, r"fail_after_steps=10"),
    (dict(fail_rank=1, fail_how="crash"), 5, r"fail_how='crash' is not one of"),
    (dict(colocated=True, fail_rank=1, fail_how="exit"), 4, r"fail_how='exit' with colocated=True"),
    (dict(lr=0, momentum=1.0, shard_by="rows"), 5, r"lr=0.*momentum=1.0.*shard_by='rows'"),   # all listed
])
def test_bad_configs_are_named(kwargs, world_size, message):
    with pytest.raises(ValueError, match=message):
        PSConfig(**kwargs).validate(world_size)


def test_good_configs_and_roles():
    assert PSConfig().validate(2).worker_ranks(2) == [1]
    assert PSConfig(servers=2).worker_ranks(5) == [2, 3, 4]
    assert PSConfig(colocated=True).validate(4).num_servers(4) == 4


# ---------------------------------------------------------------- on a world
def receivers_alive():
    return sum(t.name == "ddnb-ps-receiver" for t in threading.enumerate())


LOST_WORKER_WORLDS = []   # worlds where a server lost a worker


@pytest.fixture(scope="module", autouse=True)
def receivers_end():
    """A server whose worker was lost leaves its receiver blocked until its run's group
    times out (2 worker_timeout + 10 s); let it end before the worlds are closed."""
    yield
    deadline = time.monotonic() + 15
    for w in LOST_WORKER_WORLDS:
        while not w.broken and sum(w.run(receivers_alive)) and time.monotonic() < deadline:
            time.sleep(0.5)


def test_bad_config_raises_on_every_rank_before_any_message(world, splits):
    w = world(5)
    w.run(take_events)
    for config, message in [(PSConfig(servers=5), "leaves no worker"),
                            (PSConfig(servers=3, shard_by="layer"), "2 layers"),     # from the model
                            (PSConfig(batch_size=400), "batch_size=400")]:           # from the data
        t0 = time.monotonic()
        with pytest.raises(WorkerError, match=r"ranks \[0, 1, 2, 3, 4\] raised") as e:
            w.run(train, config, MODEL, splits[0])
        assert time.monotonic() - t0 < 5 and "ValueError" in str(e.value) and message in str(e.value)
    assert not [ev for evs in w.run(take_events) for ev in evs if ev["kind"] in ("send", "recv")]


@pytest.mark.parametrize("mode", ["asp", "ssp"])
def test_async_goes_on_without_a_silent_worker(world, splits, mode):
    config = PSConfig(mode=mode, staleness=1 if mode == "ssp" else 0, steps=15, batch_size=16, lr=0.05,
                      worker_timeout=1.0, fail_rank=2, fail_after_steps=3)
    LOST_WORKER_WORLDS.append(world(5))
    res = world(5).run(train, config, MODEL, splits[0], timeout=30)
    (server,) = servers_of(res)
    assert [lost["rank"] for lost in server["lost"]] == [2] and server["lost"][0]["silent_s"] >= 1.0
    assert [wk["pushes"] for wk in workers_of(res)] == [15, 3, 15, 15] and res[2]["silent"]
    assert server["updates"] == server["gradients"] == 3 * 15 + 3


def test_bsp_with_a_silent_worker_raises_naming_it(world, splits):
    config = PSConfig(mode="bsp", steps=15, batch_size=16, worker_timeout=1.0, fail_rank=3, fail_after_steps=4)
    w = world(5)
    LOST_WORKER_WORLDS.append(w)
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match=r"ranks \[0, 1, 2, 4\] raised") as e:
        w.run(train, config, MODEL, splits[0], timeout=30)
    assert time.monotonic() - t0 < 1.0 + 5
    msg = str(e.value)
    assert "worker rank 3 sent nothing for" in msg and "ParameterServerError" in msg
    res = world(5).run(train, PSConfig(steps=2), MODEL, splits[0])    # the world is fine afterwards
    assert servers_of(res)[0]["version"] == 2


def test_colocated_with_a_silent_rank_raises_naming_it(world, splits):
    config = PSConfig(colocated=True, steps=10, batch_size=16, worker_timeout=1.0, fail_rank=2, fail_after_steps=3)
    w = world(4)
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match=r"ranks \[0, 1, 3\] raised") as e:
        w.run(train, config, MODEL, splits[0], timeout=30)
    assert time.monotonic() - t0 < 1.0 + 5 and "rank 2 is lost or hung" in str(e.value)


def test_bsp_equals_single_process_sgd_and_bytes_per_rank(world, splits):
    w = world(5)                                              # 1 server, N = 4 workers
    w.run(take_events)
    res = w.run(train, BSP, MODEL, splits[0])
    events = [e for evs in w.run(take_events) for e in evs]
    (server,) = servers_of(res)
    assert max_diff(final_params(res), reference(BSP, splits[0], 4, 20)) < 1e-6
    assert server["version"] == server["updates"] == 20 and server["gradients"] == 80
    assert all(a["staleness"] == 0 for a in server["applied"]) and len(server["applied"]) == 80
    assert [wk["clocks"] for wk in workers_of(res)] == [list(range(20))] * 4
    assert [wk["versions"] for wk in workers_of(res)] == [[[v] for v in range(20)]] * 4
    # the central server's link: N·S out (params) and N·S in (gradients) per step, plus headers
    t, n, steps = traffic(events, 5), 4, 20
    assert t["sent"][0] == steps * n * (H + S)
    assert t["received"][0] == steps * n * (H + H + S) + n * H             # pull, push; done
    assert t["sent"][1:] == [steps * (2 * H + S) + H] * 4 and t["received"][1:] == [steps * (H + S)] * 4
    assert t["by_name"]["params"]["sent"][0] == steps * n * (H + S)


@pytest.mark.parametrize("shard_by", ["layer", "bytes"])
def test_sharded_bsp_equals_centralized(world, splits, shard_by):
    config = replace(BSP, servers=2, shard_by=shard_by)
    w = world(5)                                              # 2 servers, N = 3 workers
    w.run(take_events)
    res = w.run(train, config, MODEL, splits[0])
    events = [e for evs in w.run(take_events) for e in evs]
    central = final_params(world(4).run(train, BSP, MODEL, splits[0]))   # 1 server, N = 3 workers
    assert max_diff(final_params(res), central) < 1e-6
    assert max_diff(central, reference(BSP, splits[0], 3, 20)) < 1e-6
    shards = shard_parameters(MODEL(), 2, shard_by)
    assert [tuple(s["bounds"]) for s in servers_of(res)] == [(sh.start, sh.stop) for sh in shards]
    t, n, steps = traffic(events, 5), 3, 20
    for j, sh in enumerate(shards):                           # server j carries N·S_j each way
        assert t["sent"][j] == steps * n * (H + 4 * sh.numel)
        assert t["received"][j] == steps * n * (2 * H + 4 * sh.numel) + n * H
    if shard_by == "bytes":
        assert t["by_name"]["params"]["sent"][:2] == [steps * n * (H + S // 2)] * 2


def test_colocated_equals_centralized(world, splits):
    config = replace(BSP, colocated=True)
    w = world(4)                                              # 4 ranks, each a worker and a shard's server
    w.run(take_events)
    res = w.run(train, config, MODEL, splits[0])
    events = [e for evs in w.run(take_events) for e in evs]
    central = final_params(world(5).run(train, BSP, MODEL, splits[0]))  # 1 server, N = 4 workers
    assert max_diff(final_params(res), central) < 1e-6
    assert [r["version"] for r in res] == [20] * 4
    t = traffic(events, 4)              # about 2 (N-1)/N · S per rank per step, as a ring all-reduce
    shards = shard_parameters(MODEL(), 4, "bytes")
    for r in range(4):
        mine, others = 4 * shards[r].numel, sum(4 * s.numel for j, s in enumerate(shards) if j != r)
        assert t["sent"][r] == 20 * 3 * mine + 20 * others            # params to 3 ranks, gradient shards
        assert t["received"][r] == 20 * others + 20 * 3 * mine


@pytest.mark.parametrize("algorithm", ["ring", "tree"])
def test_allreduce_training_equals_bsp_with_less_traffic(world, splits, algorithm):
    """The same workers, batches and SGD with an all-reduce instead of the server: the same
    parameters, and each worker's link carries 2(N-1)/N·S per step (ring) where the server's
    carried 2·N·S; the server rank sits idle and sends nothing."""
    w = world(5)                                              # rank 0 idle, N = 4 workers
    w.run(take_events)
    res = w.run(train_allreduce, BSP, MODEL, splits[0], algorithm=algorithm)
    events = [e for evs in w.run(take_events) for e in evs]
    central = final_params(w.run(train, BSP, MODEL, splits[0]))
    assert [r["role"] for r in res] == ["idle"] + ["allreduce"] * 4
    for r in res[1:]:
        assert max_diff(r["params"], central) < 1e-6 and len(r["losses"]) == 20
    t, n, steps = traffic(events, 5), 4, 20
    assert t["sent"][0] == t["received"][0] == 0
    assert sum(t["received"][1:]) == sum(t["sent"][1:]) == steps * 2 * (n - 1) * S   # both: 2(N-1)·S in all
    # per worker: the formula, up to the ring's uneven chunks (9610 elements = 2403 + 2403 + 2402 + 2402)
    slack = 2 * (n - 1) * 4 if algorithm == "ring" else 0
    for sent, b in zip(t["sent"][1:], allreduce_bytes_per_rank(algorithm, S, n)):
        assert abs(sent - steps * b) <= steps * slack


def test_allreduce_training_refuses_what_has_no_all_reduce(world, splits):
    for config, message in [(replace(BSP, mode="asp"), "need mode='bsp' and colocated=False, got mode='asp'"),
                            (replace(BSP, colocated=True), "colocated=True"),
                            (BSP, "algorithm='butterfly' is not one of")]:
        kwargs = {"algorithm": "butterfly"} if config is BSP else {}
        with pytest.raises(WorkerError, match=re.escape(message)):
            world(4).run(train_allreduce, config, MODEL, splits[0], **kwargs)


def test_asp_loses_no_update(world, splits):
    config = PSConfig(mode="asp", steps=20, batch_size=16, lr=0.05, seed=1)
    res = world(5).run(train, config, MODEL, splits[0])
    (server,) = servers_of(res)
    pushes = sum(wk["pushes"] for wk in workers_of(res))
    assert server["updates"] == server["gradients"] == pushes == server["version"] == 80
    assert server["dropped"] == 0 and server["lost"] == []
    assert len(server["applied"]) == 80 and all(a["staleness"] >= 0 for a in server["applied"])
    assert [a["version"] for a in server["applied"]] == list(range(80))          # one update per gradient


def check_ssp(server, workers, n, s):
    """What SSP(s) guarantees (consistency.py), read back from the records."""
    assert all(a["staleness"] <= staleness_bound(n, s) for a in server["applied"])
    assert all(a["read_version"] >= n * (a["clock"] - s) for a in server["applied"])
    counts = {wk["rank"]: 0 for wk in workers}                # clocks replayed in apply order
    for a in server["applied"]:
        counts[a["worker"]] += 1
        assert max(counts.values()) - min(counts.values()) <= s + 1
    for wk in workers:                                        # the worker's view: same rule
        assert all(v >= n * (c - s) for c, (v,) in zip(wk["clocks"], wk["versions"]))


@pytest.mark.parametrize("s", [0, 2])
def test_ssp_stays_within_its_bound(world, splits, s):
    config = PSConfig(mode="ssp", staleness=s, steps=12, batch_size=16, lr=0.05, straggler_rank=2,
                      straggler_delay=0.02)
    res = world(5).run(train, config, MODEL, splits[0])
    (server,) = servers_of(res)
    check_ssp(server, workers_of(res), 4, s)
    assert server["updates"] == server["gradients"] == 48
    if s == 0:                                                # lock-step: clock c saw every gradient of clocks < c
        assert max(a["staleness"] for a in server["applied"]) <= 3


def test_straggler_slows_bsp_and_goes_stale_in_asp(world, splits):
    delay, steps = 0.1, 5
    base = dict(steps=steps, batch_size=16, lr=0.05, straggler_rank=1, straggler_delay=delay)
    bsp = servers_of(world(5).run(train, PSConfig(mode="bsp", **base), MODEL, splits[0]))[0]
    asp = servers_of(world(5).run(train, PSConfig(mode="asp", **base), MODEL, splits[0]))[0]
    # bsp: every update waits for the straggler's gradient, so updates are >= delay apart
    times = [h["time"] for h in bsp["history"]]
    assert all(b - a >= 0.9 * delay for a, b in zip(times, times[1:]))
    assert all(a["staleness"] == 0 for a in bsp["applied"])
    # asp: the others go on, so the straggler's first gradient missed updates of every other worker
    stale = [a["staleness"] for a in asp["applied"] if a["worker"] == 1]
    assert len(stale) == steps and stale[0] >= 3
    assert asp["updates"] == 4 * steps


@pytest.mark.parametrize("layout", [dict(), dict(servers=2, shard_by="layer"), dict(colocated=True)])
def test_checkpoint_then_restore_equals_straight_run(world, splits, tmp_path, layout):
    straight = replace(BSP, **layout)
    first = replace(straight, steps=10, checkpoint_to=str(tmp_path / "ps"))
    second = replace(straight, steps=10, restore_from=str(tmp_path / "ps"))
    w = world(5)
    want = final_params(w.run(train, straight, MODEL, splits[0]))
    w.run(train, first, MODEL, splits[0])
    k = first.num_servers(5)
    assert all((tmp_path / checkpoint_file("ps", j, k)).exists() for j in range(k))
    res = w.run(train, second, MODEL, splits[0])
    assert max_diff(final_params(res), want) < 1e-6
    assert all(r["version"] == 20 and r["start_version"] == 10 for r in servers_of(res))
    assert all(wk["clocks"] == list(range(10, 20)) for wk in workers_of(res))


def test_restore_from_a_missing_checkpoint_fails_before_any_message(world, splits, tmp_path):
    config = PSConfig(steps=2, restore_from=str(tmp_path / "nothing"))
    with pytest.raises(WorkerError, match=r"(?s)ranks \[0, 1, 2, 3, 4\] raised.*no checkpoint"):
        world(5).run(train, config, MODEL, splits[0])


def test_digits_reach_95_percent_with_bsp(world, splits):
    config = PSConfig(mode="bsp", steps=150, batch_size=32, lr=0.05, momentum=0.9)
    res = world(5).run(train, config, MODEL, splits[0])
    model = assemble(res, MODEL)
    assert accuracy(model, splits[1]) >= 0.95
    losses = [h["loss"] for h in servers_of(res)[0]["history"]]
    assert sum(losses[-10:]) < 0.2 * sum(losses[:10])
