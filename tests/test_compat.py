"""ddnb.compat: the flat collectives under both of torch's names give the same result
(found on a GPU machine whose torch 2.11 has only the old names)."""
import torch


def _both_names():
    import torch.distributed as dist

    from ddnb.compat import all_gather_single, reduce_scatter_single

    rank, n = dist.get_rank(), dist.get_world_size()
    x = torch.arange(3 * n, dtype=torch.float32) * (rank + 1)       # (3N,)
    out = {}
    for label in ("new", "old"):
        saved = {}
        if label == "old":      # what torch 2.1-2.12 have: hide the 2.13 names for this call
            for name in ("all_gather_single", "reduce_scatter_single"):
                if hasattr(dist, name):
                    saved[name] = getattr(dist, name)
                    delattr(dist, name)
        try:
            gathered, scattered = torch.empty(3 * n * n), torch.empty(3)
            all_gather_single(gathered, x)
            reduce_scatter_single(scattered, x)
            out[label] = (gathered.tolist(), scattered.tolist())
        finally:
            for name, fn in saved.items():
                setattr(dist, name, fn)
    return out


def test_old_and_new_names_agree(world):
    n = 2
    for rank, out in enumerate(world(n).run(_both_names)):
        x = [torch.arange(3 * n, dtype=torch.float32) * (r + 1) for r in range(n)]
        expected = (torch.cat(x).tolist(), sum(x)[3 * rank:3 * rank + 3].tolist())
        assert out["new"] == expected
        assert out["old"] == expected

