"""Solution of `ddnb.exercises.bucketed` (`notebooks/06_data_parallelism.ipynb`): the core of
DDP's reducer (Li et al. 2020, Sec. 3.2.2-3.2.3), as a learner writes it in the notebook."""
from __future__ import annotations

import torch
import torch.distributed as dist


class MyBucketSync:
    """Bucketed, overlapped gradient averaging: a bucket's all-reduce starts, asynchronously,
    in the hook of its last gradient; finish() waits for every one and writes the means back."""

    def __init__(self, params, buckets):
        self.params, self.buckets = params, buckets
        self.bucket_of = {i: k for k, bucket in enumerate(buckets) for i in bucket}
        self.missing = [len(b) for b in buckets]           # gradients each bucket still waits for
        self.launched = []                                 # (bucket, flat tensor, work), in launch order
        for i, p in enumerate(params):
            p.register_post_accumulate_grad_hook(lambda p, i=i: self.ready(i))

    def ready(self, i):
        k = self.bucket_of[i]
        self.missing[k] -= 1
        if self.missing[k] == 0:                           # the bucket's last gradient: send it now
            flat = torch.cat([self.params[j].grad.reshape(-1) for j in self.buckets[k]])
            self.launched.append((k, flat, dist.all_reduce(flat, async_op=True)))

    def finish(self):
        for k, flat, work in self.launched:
            work.wait()
            flat /= dist.get_world_size()
            offset = 0
            for j in self.buckets[k]:
                g = self.params[j].grad
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
        self.launched, self.missing = [], [len(b) for b in self.buckets]
