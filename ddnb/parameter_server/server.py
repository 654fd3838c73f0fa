"""A parameter server: holds (a shard of) the parameters and the optimizer, answers pulls,
applies pushes (Li et al. 2014, "Scaling Distributed Machine Learning with the Parameter
Server", OSDI, Sec. 3: the server nodes keep the globally shared parameters; workers pull
them and push gradients).

`Server` is the state: the flat parameter slice params (S_j,) of elements start..stop of
the model's flat vector, an SGD optimizer over it (momentum is element-wise, so SGD on the
flat slice equals SGD on the model's tensors), the version (updates applied) and every
worker's clock (gradients received). `serve` is the loop, on the server's main thread:

    take the next message from the Receiver thread (or time out)
      pull   -> remember that the worker waits
      push   -> bsp: keep it; once every live worker pushed its step: average, one update
                asp / ssp: one update with it now; record its staleness
      done   -> the worker finished
    answer every waiting pull that consistency rule (1) allows   (consistency.py)
    a worker not waiting on us and silent for `worker_timeout` s is lost:
      asp / ssp: reported, dropped from the slowest-worker rule, training goes on
      bsp: every live worker gets "stop", and this rank raises, naming the lost rank

Replies go out from this thread while the Receiver waits on the same group: gloo allows a
send on one thread while another waits in a receive. On a pure nccl group the messages
live on this rank's GPU and the receiving is done by a `NamedReceiver` in this thread
(nccl has no any-source receive; see `messages`); the parameters and the optimizer stay
where the model put them. Taught in
`notebooks/04_parameter_server.ipynb`.
"""
from __future__ import annotations

import copy
import queue
import time

import torch

from ddnb.collectives import p2p
from ddnb.parameter_server.consistency import bound, may_proceed
from ddnb.parameter_server.messages import (PARAMS, STOP, NamedReceiver, ParameterServerError, Receiver, header,
                                            message_device, send_message, wait_within)
from ddnb.trace import Tracer, get_tracer


class Server:
    """Shard `shard` = elements start..stop of the flat parameter vector, with its SGD."""

    def __init__(self, params: torch.Tensor, workers, lr: float, momentum: float = 0.0,
                 shard: int = 0, bounds: tuple[int, int] | None = None):
        self.params = torch.nn.Parameter(params.detach().clone().reshape(-1))   # (S_j,)
        self.optimizer = torch.optim.SGD([self.params], lr=lr, momentum=momentum)
        self.lr, self.momentum = lr, momentum
        self.shard = shard
        self.bounds = tuple(bounds) if bounds is not None else (0, self.params.numel())
        self.version = 0
        self.clocks = {int(w): 0 for w in workers}

    def apply(self, grad: torch.Tensor) -> None:
        """One optimizer step with `grad` (S_j,); the version goes up by one."""
        self.params.grad = grad.reshape(-1).to(self.params.device, self.params.dtype)
        self.optimizer.step()
        self.params.grad = None
        self.version += 1

    def state_dict(self) -> dict:
        """Everything needed to go on later: parameters, optimizer state, version, clocks
        (a copy: the optimizer's own state_dict shares its live momentum buffers)."""
        return {"params": self.params.detach().clone(), "optimizer": copy.deepcopy(self.optimizer.state_dict()),
                "version": self.version, "clocks": dict(self.clocks), "shard": self.shard,
                "bounds": self.bounds}

    def load_state_dict(self, state: dict) -> None:
        """Restore a `state_dict()`. The learning rate and momentum stay this server's
        (the run's config), not the checkpoint's."""
        if tuple(state["bounds"]) != self.bounds or set(state["clocks"]) != set(self.clocks):
            raise ValueError(f"checkpoint of shard {state['shard']} holds elements {tuple(state['bounds'])} "
                             f"for workers {sorted(state['clocks'])}; this server holds {self.bounds} for "
                             f"workers {sorted(self.clocks)}: same servers, workers and shard_by needed")
        with torch.no_grad():
            self.params.copy_(state["params"])
        self.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))
        for g in self.optimizer.param_groups:
            g["lr"], g["momentum"] = self.lr, self.momentum
        self.version = int(state["version"])
        self.clocks = {int(w): int(c) for w, c in state["clocks"].items()}


def serve(server: Server, mode: str, staleness: int, worker_timeout: float, group,
          tracer: Tracer | None = None, t0: float | None = None) -> dict:
    """Run the server loop until every worker is done or lost; returns its stats (see
    `ddnb.parameter_server.train`). Ranks are ranks of `group`."""
    tr, t0 = get_tracer(tracer), t0 or time.time()
    workers = sorted(server.clocks)
    limit = bound(mode, staleness)
    device = message_device(group)
    any_source = device.type == "cpu"      # gloo receives from any source; nccl names them
    rx = (Receiver if any_source else NamedReceiver)(group, server.params.numel(), workers, tracer)
    rx.start()
    heard = {w: time.monotonic() for w in workers}
    waiting: set[int] = set()                 # workers whose pull we have not answered
    done, lost = set(), {}                    # lost: rank -> seconds it had been silent
    pending: dict[int, tuple] = {}            # bsp: rank -> (grad, header) of this step
    stats = {"role": "server", "shard": server.shard, "bounds": server.bounds, "mode": mode,
             "start_version": server.version, "updates": 0, "gradients": 0, "dropped": 0,
             "pushes": {w: 0 for w in workers}, "applied": [], "history": [], "lost": []}

    def live():
        return [w for w in workers if w not in done and w not in lost]

    def update(grad, msgs):
        with tr.span("compute", "update"):
            server.apply(grad)
        now = time.time() - t0
        stats["updates"] += 1
        stats["history"].append({"time": now, "version": server.version,
                                 "loss": sum(m["loss"] for _, m in msgs) / len(msgs)})
        for w, m in msgs:   # staleness = updates this gradient did not see (0 for bsp)
            stats["applied"].append({"worker": w, "clock": m["clock"], "read_version": m["version"],
                                     "version": server.version - 1, "time": now,
                                     "staleness": server.version - 1 - m["version"]})

    def on_push(w, m, grad):
        stats["gradients"] += 1
        stats["pushes"][w] += 1
        if w in lost:                          # it came back after we gave up on it
            stats["dropped"] += 1
            return
        server.clocks[w] += 1
        if mode != "bsp":
            update(grad, [(w, m)])
            return
        pending[w] = (grad, m)
        if all(v in pending for v in live()):  # every live worker pushed this step (Li et al. Alg. 1)
            ranks = sorted(pending)
            update(torch.stack([pending[v][0] for v in ranks]).mean(0), [(v, pending[v][1]) for v in ranks])
            pending.clear()

    try:
        while live():
            now = time.monotonic()
            suspects = [w for w in live() if w not in waiting]
            deadline = min((heard[w] + worker_timeout for w in suspects), default=now + worker_timeout)
            try:
                src, m, payload = rx.get(timeout=max(0.0, deadline - now) + 1e-3)
            except queue.Empty:
                src = m = None
            if isinstance(m, Exception):
                raise RuntimeError(f"server rank {p2p.group_rank(group)}: receiving failed: {m}") from m
            if src is not None:
                heard[src] = time.monotonic()
                if m["kind"] == "pull":
                    if src in lost:
                        send_message(STOP, src, group, tracer, arg=src, version=server.version)
                    else:
                        waiting.add(src)
                elif m["kind"] == "push":
                    on_push(src, m, payload)
                elif m["kind"] == "done":
                    done.add(src)
                    waiting.discard(src)
            now = time.monotonic()
            for w in [w for w in live() if w not in waiting and now - heard[w] > worker_timeout]:
                lost[w] = now - heard[w]
                stats["lost"].append({"rank": w, "time": time.time() - t0, "silent_s": lost[w],
                                      "clock": server.clocks[w]})
                if mode == "bsp":
                    raise ParameterServerError(
                        f"server rank {p2p.group_rank(group)}: worker rank {w} sent nothing for {lost[w]:.1f} s "
                        f"(worker_timeout={worker_timeout} s) at version {server.version}; synchronous training "
                        f"(mode='bsp') cannot go on without it: workers {live()} are told to stop "
                        f"(mode='asp' or 'ssp' go on without lost workers)", ranks=[w])
            for w in sorted(waiting):
                if may_proceed(server.clocks[w], server.clocks, live(), limit):
                    waiting.discard(w)
                    send_message(PARAMS, w, group, tracer, payload=server.params, clock=server.clocks[w],
                                 version=server.version)
                    rx.expect(w)                  # nothing owed to it now: listen for its push
                    heard[w] = time.monotonic()   # its silence counts from our answer
    except BaseException as e:
        lost_ranks = getattr(e, "ranks", None) or [-1]
        _stop(live(), lost_ranks[0], server.version, group, tracer, worker_timeout)
        rx.close()
        raise
    rx.close()
    if not lost:
        rx.join()
    elif len(lost) == len(workers):
        raise ParameterServerError(f"server rank {p2p.group_rank(group)}: every worker was lost "
                                   f"({sorted(lost)}, silent for more than worker_timeout={worker_timeout} s)",
                                   ranks=sorted(lost))
    stats.update(version=server.version, worker_clocks=dict(server.clocks), state=server.state_dict())
    return stats


def _stop(workers, lost_rank, version, group, tracer, timeout) -> None:
    """Tell `workers` to stop (best effort: a worker that never listens again is not
    waited on for more than `timeout` s; this run's group is not used again)."""
    device = message_device(group)
    sends = [p2p.isend(header(STOP, version=version, arg=lost_rank, device=device), w, group, tracer, name="stop")
             for w in workers]
    for s in sends:
        try:
            wait_within(s, timeout)
        except RuntimeError:
            pass
