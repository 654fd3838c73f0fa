"""Where the small messages every rank sends (checks' headers, the parameter server's
headers) live, and tensors built beside CUDA inputs: decided by the group alone (never by
a rank's arguments, so a rank with bad arguments meets the others on the same backend),
and created on the inputs' device. Read as on a GPU cluster: the backend is patched, no
GPU is needed."""
import pytest
import torch
import torch.distributed as dist

from ddnb.collectives import ops
from ddnb.context_parallel.allgather import positions
from ddnb.parameter_server.messages import message_device


@pytest.mark.parametrize("backend, expected", [("gloo", "cpu"), ("cpu:gloo,cuda:nccl", "cpu"), ("nccl", "cuda:0")])
def test_headers_live_where_the_group_carries_them(monkeypatch, backend, expected):
    monkeypatch.setattr(dist, "get_backend", lambda group=None: backend)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert ops.header_device() == message_device() == torch.device(expected)
    for passed in (torch.zeros(3), "not a tensor", torch.zeros(3, device="meta")):   # a bad argument too
        assert ops._check_device(passed, None) == torch.device(expected)


def test_causal_positions_are_built_on_the_queries_device():
    assert positions(1, 2, 4, "zigzag", device="meta").device.type == "meta"
    assert positions(1, 2, 4, "zigzag").tolist() == [2, 3, 4, 5]          # chunks 1 and 2 of 4 (ring's zigzag)
    assert positions(0, 2, 4, "contiguous").tolist() == [0, 1, 2, 3]


def _through_the_wire_device():
    """On a rank, every message's wire device made "cpu:0", another device than its
    tensors' "cpu" (as the host is for a CUDA tensor on gloo): exchange (post), send /
    recv, isend / irecv and a ring attention forward and backward deliver the same values
    through the host copies and buffers as without them."""
    import torch.distributed as dist

    from ddnb.collectives import p2p
    from ddnb.context_parallel import ring_attention

    r, n = dist.get_rank(), dist.get_world_size()

    def messages():
        x, got = torch.full((4,), float(r)), []
        buf = torch.empty(4)
        p2p.exchange(x, (r + 1) % n, buf, (r - 1) % n)
        got.append(buf.clone())
        if r == 0:
            p2p.send(x + 10, 1)
            p2p.isend(x + 20, 1).wait()
        elif r == 1:
            for _ in range(2):
                p2p.recv(buf, 0) if not got[1:] else p2p.irecv(buf, 0).wait()
                got.append(buf.clone())
        g = torch.Generator().manual_seed(r)
        q, k, v = (torch.randn(1, 2, 4, 3, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
        out = ring_attention(q, k, v, causal=True)
        out.square().sum().backward()
        return got + [out.detach(), q.grad, k.grad, v.grad]

    plain = messages()
    saved, staged = p2p.wire_device, []
    p2p.wire_device = lambda tensor, group=None: staged.append(tensor.shape) or torch.device("cpu", 0)
    try:
        through = messages()
    finally:
        p2p.wire_device = saved
    return len(staged), [torch.equal(a, b) for a, b in zip(plain, through)], [t.tolist() for t in plain[:-4]]


def test_messages_travel_through_a_copy_on_their_wire_device(world):
    (n0, same0, got0), (n1, same1, got1) = world(2).run(_through_the_wire_device)
    assert n0 > 0 and n1 > 0 and all(same0) and all(same1) and len(same1) == 7
    assert got0 == [[1.0] * 4] and got1 == [[0.0] * 4, [10.0] * 4, [20.0] * 4]
