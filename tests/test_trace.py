"""ddnb.trace: recording, message matching, bytes per rank, Chrome trace export."""
import json

import pytest
import torch
import torch.distributed as dist

from ddnb.collectives import p2p
from ddnb.trace import Tracer, bytes_sent, flatten, match_messages, take_events, to_chrome_trace


def sample_events():
    t = Tracer(rank=0)
    t.record("compute", "forward", 1.0, 1.5)
    t.record("send", "x", 1.5, 1.7, peer=1, nbytes=400)
    t.record("send", "y", 1.8, 1.9, peer=1, nbytes=100)
    u = Tracer(rank=1)
    u.record("recv", "x", 1.4, 1.75, peer=0, nbytes=400)
    u.record("recv", "y", 1.76, 1.95, peer=0, nbytes=100)
    return flatten([t.take(), u.take()])


def test_record_span_take():
    t = Tracer(rank=3)
    with t.span("compute", "matmul"):
        sum(range(1000))
    [e] = t.take()
    assert e["rank"] == 3 and e["kind"] == "compute" and e["name"] == "matmul"
    assert e["end"] >= e["start"]
    assert t.take() == []


def test_disabled_tracer_records_nothing_and_bad_kind_is_rejected():
    t = Tracer(rank=0, enabled=False)
    t.record("send", "x", 0, 1)
    with t.span("compute"):
        pass
    assert t.take() == []
    with pytest.raises(ValueError, match="kind='sned' is not one of"):
        Tracer(rank=0).record("sned", "x", 0, 1)


def test_bounded_memory():
    t = Tracer(rank=0, max_events=10)
    for i in range(25):
        t.record("compute", str(i), i, i + 1)
    assert [e["name"] for e in t.take()] == [str(i) for i in range(15, 25)]


def test_messages_match_in_order_and_bytes_per_rank():
    events = sample_events()
    pairs = match_messages(events)
    assert [(s["name"], r["name"]) for s, r in pairs] == [("x", "x"), ("y", "y")]
    assert bytes_sent(events) == [500, 0]
    assert bytes_sent(events, world_size=3) == [500, 0, 0]


def test_chrome_trace_export(tmp_path):
    path = tmp_path / "trace.json"
    trace = to_chrome_trace(sample_events(), path=str(path))
    assert json.loads(path.read_text()) == trace
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(complete) == 5
    send_x = next(e for e in complete if e["name"] == "x" and e["cat"] == "send")
    assert send_x["pid"] == 0 and send_x["ts"] == pytest.approx(0.5e6) and send_x["dur"] == pytest.approx(0.2e6)
    assert send_x["args"] == {"peer": 1, "nbytes": 400}
    flows = [e for e in trace["traceEvents"] if e["ph"] in "sf"]
    assert len(flows) == 4 and {e["pid"] for e in flows if e["ph"] == "f"} == {1}
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {"rank 0", "rank 1"}


def traced_ring_exchange():
    rank, n = dist.get_rank(), dist.get_world_size()
    take_events()
    x = torch.full((10,), float(rank))
    y = torch.empty(10)
    p2p.exchange(x, (rank + 1) % n, y, (rank - 1) % n, name="step")
    events = take_events()
    return y[0].item(), [(e["kind"], e["peer"], e["nbytes"], e["rank"]) for e in events]


def test_p2p_exchange_is_traced(world):
    got = world(3).run(traced_ring_exchange)
    for rank, (value, events) in enumerate(got):
        assert value == (rank - 1) % 3
        assert sorted(events) == [("recv", (rank - 1) % 3, 40, rank), ("send", (rank + 1) % 3, 40, rank)]
