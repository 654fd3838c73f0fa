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
