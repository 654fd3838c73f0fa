"""The jobs of task parallelism: hyperparameter search spaces (grid, random search), one
independent training on scikit-learn's digits, and ensembles of the trained models. Each
job runs in one process; `ddnb.tasks` spreads them over the engines.

Random search: Bergstra & Bengio, "Random Search for Hyper-Parameter Optimization", JMLR
2012 (Sec. 2: with few parameters that matter, random trials cover each of them with more
distinct values than a grid of the same size). Ensembles: Dietterich, "Ensemble Methods in
Machine Learning", MCS 2000 (Sec. 2, majority vote); Lakshminarayanan et al., "Simple and
Scalable Predictive Uncertainty Estimation using Deep Ensembles", NeurIPS 2017 (Sec. 2.4,
the mean of the members' softmax). Taught in `notebooks/02_task_parallelism.ipynb`.
"""
from __future__ import annotations

import itertools
import math
import random
import time
from dataclasses import dataclass

from ddnb._checks import Checks

DEFAULTS = {"lr": 0.1, "hidden": 64, "steps": 200, "batch_size": 64, "momentum": 0.9, "seed": 0,
            "return_probs": False}


# ------------------------------------------------------------------ the search space
@dataclass(frozen=True)
class LogUniform:
    """A value drawn uniformly in log space between low and high (both > 0): learning
    rates 1e-3..1 get as many draws per decade (Bergstra & Bengio 2012, Sec. 2)."""

    low: float
    high: float

    def __post_init__(self):
        with Checks("LogUniform") as check:
            if all([check.number("low", self.low, positive=True), check.number("high", self.high, positive=True)]):
                check.rule(self.low < self.high, f"need 0 < low < high, got low={self.low!r}, high={self.high!r}")

    def sample(self, rng: random.Random) -> float:
        return float(f"{math.exp(rng.uniform(math.log(self.low), math.log(self.high))):.3g}")


def grid(base: dict | None = None, **axes) -> list[dict]:
    """Every combination of the values of `axes` (itertools.product order: the last axis
    varies fastest), each merged over `base`. grid(lr=[0.1, 1], hidden=[8, 16]) ->
    [{lr: 0.1, hidden: 8}, {lr: 0.1, hidden: 16}, {lr: 1, hidden: 8}, {lr: 1, hidden: 16}]."""
    if not axes:
        raise ValueError("grid needs at least one axis, e.g. grid(lr=[0.01, 0.1])")
    empty = [k for k, v in axes.items() if not isinstance(v, (list, tuple)) or len(v) == 0]
    if empty:
        raise ValueError(f"grid axes must be non-empty lists of values; not so: "
                         + ", ".join(f"{k}={axes[k]!r}" for k in empty))
    names = list(axes)
    return [{**(base or {}), **dict(zip(names, values))} for values in itertools.product(*axes.values())]


def random_search(n: int, seed: int = 0, base: dict | None = None, **space) -> list[dict]:
    """n configurations drawn from `space`: a LogUniform is sampled, a list or tuple is
    chosen from uniformly, anything else is a fixed value. The same (n, seed, space) gives
    the same configurations, in the same order, on every machine."""
    empty = [k for k, v in space.items() if isinstance(v, (list, tuple)) and len(v) == 0]
    with Checks("random_search") as check:
        check.integer("n", n, min=1, why=" (configurations)")
        check.rule(space, "need a search space, e.g. lr=LogUniform(1e-3, 1), hidden=[16, 64]")
        check.rule(not empty, f"empty choices for {empty}")
    rng = random.Random(seed)
    draw = lambda v: v.sample(rng) if isinstance(v, LogUniform) else (
        rng.choice(list(v)) if isinstance(v, (list, tuple)) else v)
    return [{**(base or {}), **{k: draw(v) for k, v in space.items()}} for _ in range(n)]


# ------------------------------------------------------------------ one task
def check_config(config: dict) -> dict:
    """The config over DEFAULTS; raises ValueError naming every unknown key and bad value."""
    if not isinstance(config, dict):
        raise ValueError(f"a task config is a dict, got {type(config).__name__}: {config!r}")
    unknown = sorted(set(config) - set(DEFAULTS))
    c = {**DEFAULTS, **config}
    with Checks("bad task config") as check:
        check.rule(not unknown, f"unknown keys {unknown} (known: {sorted(DEFAULTS)})")
        check.positive_ints(hidden=c["hidden"], steps=c["steps"], batch_size=c["batch_size"])
        check.number("lr", c["lr"], positive=True)
        check.number("momentum", c["momentum"], min=0, below=1)
    return c


def train_digits_task(config: dict) -> dict:
    """One independent training, in the calling process: an MLP 64 -> hidden -> 10 on
    scikit-learn's digits, `steps` of SGD with momentum on seeded batches. Returns
    {test_accuracy, train_loss (mean of the last 10 steps), test_loss, seconds, pid}, and
    "probs" (test examples, 10) softmax outputs when config["return_probs"]."""
    import os

    import torch
    import torch.nn.functional as F

    from ddnb.data import batch, digits
    from ddnb.models import mlp

    c = check_config(config)
    t0 = time.perf_counter()
    train, test = digits(seed=0)
    model = mlp((64, c["hidden"], 10), seed=c["seed"])
    opt = torch.optim.SGD(model.parameters(), lr=c["lr"], momentum=c["momentum"])
    losses = []
    for step in range(c["steps"]):
        x, y = batch(train, c["batch_size"], step, seed=c["seed"])     # (B, 64), (B,)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    with torch.no_grad():
        logits = model(test.x)                                        # (n_test, 10)
    out = {"test_accuracy": (logits.argmax(-1) == test.y).float().mean().item(),
           "train_loss": sum(losses[-10:]) / len(losses[-10:]),
           "test_loss": F.cross_entropy(logits, test.y).item(),
           "seconds": time.perf_counter() - t0, "pid": os.getpid()}
    if c["return_probs"]:
        out["probs"] = torch.softmax(logits, -1)
    return out


# ------------------------------------------------------------------ ensembles
def ensemble_accuracy(probs, labels, method: str = "mean") -> float:
    """Accuracy of the ensemble of K models given their softmax outputs `probs` (K, n,
    classes) (a list of (n, classes) tensors is fine) on `labels` (n,): "mean" averages the
    probabilities, then takes the arg-max (Lakshminarayanan et al. 2017, Sec. 2.4); "vote"
    takes each model's arg-max and the most frequent class, ties to the lower class
    (Dietterich 2000, Sec. 2)."""
    import torch

    if method not in ("mean", "vote"):
        raise ValueError(f"method={method!r} is not one of ('mean', 'vote')")
    p = torch.stack(list(probs)) if not isinstance(probs, torch.Tensor) else probs    # (K, n, C)
    labels = torch.as_tensor(labels)
    if p.dim() != 3 or p.shape[0] < 1 or p.shape[1] != labels.shape[0]:
        raise ValueError(f"probs must be (K >= 1, n, classes) with n = len(labels) = {labels.shape[0]}, "
                         f"got {tuple(p.shape)}")
    if method == "mean":
        pred = p.mean(0).argmax(-1)                                                   # (n,)
    else:
        votes = torch.nn.functional.one_hot(p.argmax(-1), p.shape[-1]).sum(0)         # (n, C)
        pred = votes.argmax(-1)                # first maximum: ties go to the lower class
    return (pred == labels).float().mean().item()
