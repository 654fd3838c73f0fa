"""What every decentralized method does the same on one rank: hold its own copy of the
parameters x (S,), compute a gradient on its shard of the data at step t, measure the
consensus distance (and the test accuracy of the workers' mean) now and then, count the
bytes it sent and received from the trace, and return plain stats.

    w = Worker("dpsgd", config, model_fn, dataset, test)      # on every rank
    loss, g = w.gradient(x, step)                               # (), (S,)
    w.measure(step + 1, x)
    return w.finish(x)

Returns {"method", "rank", "world_size", "topology", "spectral_gap", "losses" (per step,
this rank's batch loss), "times" (s since the start barrier), "measured" [{"step",
"consensus", "accuracy"}], "params" (this rank's x), "mean_params" (x_bar), "bytes_sent",
"bytes_received" (payload bytes this rank's traced messages carried during the run),
"steps", "wall_time", "config"}. The worker computes where `model_fn()` put the model
(its batches and the test set are moved there; x lives there too): a CUDA model trains on
its GPU, its messages travelling as `ddnb.collectives.p2p` carries them.
Taught in `notebooks/05b_decentralized.ipynb`.
"""
from __future__ import annotations

from dataclasses import asdict

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ddnb.collectives import p2p
from ddnb.data import Dataset
from ddnb.decentralized.config import DecentralizedConfig, straggle
from ddnb.decentralized.gossip import consensus_distance, mean_params
from ddnb.decentralized.topology import topology
from ddnb.models import accuracy, flat_params, load_flat
from ddnb.parameter_server.worker import forward_backward, worker_batch
from ddnb.trace import get_tracer, now


class Worker:
    """One rank of a decentralized run (every rank of `group` is one)."""

    def __init__(self, method: str, config: DecentralizedConfig, model_fn, dataset, test=None, group=None,
                 tracer=None, loss_fn=None):
        self.n, self.rank = p2p.group_size(group), p2p.group_rank(group)
        dataset = dataset if isinstance(dataset, Dataset) else Dataset(*dataset)
        config.validate(self.n, len(dataset))          # before any message: every rank raises alike
        self.config, self.dataset, self.group = config, dataset, group
        self.topo = topology(config.topology, self.n)
        self.model = model_fn()
        self.device = next((p.device for p in self.model.parameters()), torch.device("cpu"))
        self.test = None if test is None else Dataset(*(t.to(self.device) for t in test))
        self.loss_fn = loss_fn or F.cross_entropy
        self.tracer = get_tracer(tracer)
        self.stats = {"method": method, "rank": self.rank, "world_size": self.n, "topology": self.topo.name,
                      "spectral_gap": self.topo.spectral_gap, "losses": [], "times": [], "measured": []}
        if self.n > 1:
            dist.barrier(group=group)
        self.t0 = now()   # the trace's clock: emulated seconds in an emulated cluster

    def initial(self) -> torch.Tensor:
        """x_0 (S,): model_fn()'s parameters, the same on every rank."""
        return flat_params(self.model).clone()

    def gradient(self, x: torch.Tensor, step: int):
        """(loss, gradient (S,)) at x on this rank's batch of `step`; the straggler sleeps after it."""
        xb, yb = (t.to(self.device) for t in worker_batch(self.dataset, self.rank, self.n, self.config.batch_size,
                                                          step, self.config.seed))
        loss, grad = forward_backward(self.model, x, xb, yb, self.loss_fn, self.tracer)   # (), (S,)
        straggle(self.config, self.rank, self.tracer)
        self.stats["losses"].append(loss.item())
        return loss, grad

    def tick(self) -> None:
        """Record the end of a step."""
        self.stats["times"].append(now() - self.t0)

    def measure(self, step: int, x: torch.Tensor, force: bool = False) -> None:
        """At step 0, every measure_every steps and when forced: consensus distance and the
        accuracy of x_bar on the test set (every rank must call it at the same steps)."""
        if not force and step % self.config.measure_every:
            return
        mean = mean_params(x, self.group)
        acc = accuracy(load_flat(self.model, mean), self.test) if self.test is not None else None
        self.stats["measured"].append({"step": step, "consensus": consensus_distance(x, self.group, mean),
                                       "accuracy": acc})

    def finish(self, x: torch.Tensor) -> dict:
        """The stats, with the final parameters and the bytes traced since the start."""
        end = now()
        if not self.stats["measured"] or self.stats["measured"][-1]["step"] != self.config.steps:
            self.measure(self.config.steps, x, force=True)
        sent = recv = 0
        for e in self.tracer.events:
            if e["start"] >= self.t0 and e["start"] <= end:
                sent += e["nbytes"] if e["kind"] == "send" else 0
                recv += e["nbytes"] if e["kind"] == "recv" else 0
        self.stats.update(params=x.detach().clone(), mean_params=mean_params(x, self.group), bytes_sent=sent,
                          bytes_received=recv, steps=self.config.steps, wall_time=end - self.t0,
                          config=asdict(self.config) if isinstance(self.config.topology, str) else None)
        return self.stats
