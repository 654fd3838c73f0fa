"""The hierarchical parameter server (ddnb.parameter_server.hierarchical): BSP arithmetic
equal to one process on the concatenated batches, one message per host across hosts
(bytes from the trace = the formula), bad arguments named, and it runs emulated, where a
slow inter-host link makes the hierarchy pay."""
from functools import partial

import pytest
import torch

from conftest import bsp_reference
from ddnb.models import flat_params, mlp
from ddnb.parameter_server.hierarchical import hierarchical_bytes, hosts, train_hierarchical

MODEL = partial(mlp, (64, 16, 10), seed=0)


def _single_process(workers, steps, batch_size, lr, momentum=0.0, seed=0):
    return bsp_reference(MODEL, workers, steps, batch_size, lr, momentum, seed)


def _run(ranks_per_host, steps=4, trace=False):
    from ddnb.data import digits
    from ddnb.trace import Tracer

    train_set, _ = digits(seed=0)
    tracer = Tracer(enabled=trace)
    out = train_hierarchical(MODEL, train_set, ranks_per_host, steps, batch_size=16, lr=0.1, momentum=0.9,
                             tracer=tracer)
    out["events"] = tracer.take()
    return out


def test_hosts_put_the_server_first_on_host_0():
    assert hosts(5, 2) == [[0, 1], [2, 3], [4]] and hosts(3, 4) == [[0, 1, 2]] and hosts(3, 1) == [[0], [1], [2]]


@pytest.mark.parametrize("ranks_per_host", [1, 2, 3])
def test_hierarchical_bsp_equals_one_process_on_the_concatenated_batches(world, ranks_per_host):
    results = world(5).run(_run, ranks_per_host)
    server = results[0]
    assert [r["role"] for r in results][0] == "server"
    assert torch.allclose(server["params"], _single_process(4, 4, 16, 0.1, 0.9), atol=1e-6, rtol=0)


def test_one_message_per_host_crosses_to_the_server(world):
    """Traced bytes on the server's link to other hosts = 2 (H - 1) S per step; within a
    host, the leader's link carries 2 (g - 1) S."""
    steps, g = 3, 2
    results = world(5).run(_run, g, steps, True)
    S = flat_params(MODEL()).numel() * 4
    expected = hierarchical_bytes(S, 5, g)
    host_of = {r: h for h, ranks in enumerate(hosts(5, g)) for r in ranks}
    cross = sum(e["nbytes"] for e in results[0]["events"] if e["kind"] in ("send", "recv") and host_of[e["peer"]] != 0)
    assert cross == steps * expected["hierarchical"] == steps * 2 * 2 * S
    leader = results[2]                                  # host 1's leader: rank 2, member 3
    inside = sum(e["nbytes"] for e in leader["events"] if e["kind"] in ("send", "recv") and e["peer"] == 3)
    assert inside == steps * expected["intra_host"]
    assert expected["flat"] == 2 * 3 * S                  # workers 2, 3, 4 are on other hosts than the server


def test_bad_arguments_are_named_together():
    with pytest.raises(ValueError) as e:
        hierarchical_bytes(0, 1, 0)
    assert all(k in str(e.value) for k in ("param_bytes", "world_size", "ranks_per_host"))


def test_it_runs_emulated_and_the_hierarchy_pays_on_a_slow_inter_host_link():
    """Same arithmetic in an emulated cluster; with NVLink-like links inside a host and a
    slow network between hosts, two workers per host halve the messages the server's link
    carries, and the step is shorter (emulated seconds)."""
    from ddnb.emulate import Link, custom
    from ddnb.testing import World

    profile = custom(alpha=1e-4, bandwidth=1e7, peak_flops=1e11, efficiency=1.0, memory_bandwidth=1e12,
                     slowdown=20).with_(intra=Link(1e-5, 1e9), ranks_per_host=2)
    with World(5, emulate=profile, timeout=120) as w:
        grouped = w.run(_run, 2, 3)
        flat = w.run(_run, 1, 3)
    assert torch.allclose(grouped[0]["params"], flat[0]["params"], atol=1e-6, rtol=0)
    assert max(grouped[0]["times"][1:]) < min(flat[0]["times"][1:])
