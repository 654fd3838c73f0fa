"""Small models for the notebooks, built the same on every rank from a seed.

    model = mlp((64, 128, 10), seed=0)       # 64 -> 128 -> ReLU -> 10
    flat = flat_params(model)                 # (9610,) all parameters, in model order
    load_flat(model, flat)                    # and back
    accuracy(model, test)                     # fraction of test examples classified right

A distributed run ships parameters as one flat vector (a parameter server's pull and
push, an all-reduce's buffer): `flat_params` / `load_flat` are that view, in the order of
`model.parameters()`. Used from `notebooks/04_parameter_server.ipynb` on.
"""
from __future__ import annotations

import torch
from torch import nn


def mlp(sizes=(64, 128, 10), seed: int = 0, activation=nn.ReLU) -> nn.Sequential:
    """A multi-layer perceptron Linear(sizes[0], sizes[1]) -> activation -> ... ->
    Linear(sizes[-2], sizes[-1]) (no activation after the last layer: it outputs logits),
    initialized by PyTorch's defaults under `seed` without touching the global RNG."""
    sizes = tuple(sizes)
    if len(sizes) < 2 or not all(isinstance(s, int) and s >= 1 for s in sizes):
        raise ValueError(f"sizes must be at least two positive integers (input, ..., output), got {sizes!r}")
    layers = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            layers.append(nn.Linear(a, b))
            if i < len(sizes) - 2:
                layers.append(activation())
    return nn.Sequential(*layers)


def flat_params(model: nn.Module) -> torch.Tensor:
    """All parameters as one new flat vector (numel,), in `model.parameters()` order."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def flat_grads(model: nn.Module) -> torch.Tensor:
    """All parameter gradients as one flat vector (numel,), zeros where a grad is None."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in model.parameters()])


def load_flat(model: nn.Module, flat: torch.Tensor) -> nn.Module:
    """Copy the flat vector (numel,) into the model's parameters, in place; returns the model."""
    numel = sum(p.numel() for p in model.parameters())
    if flat.numel() != numel:
        raise ValueError(f"flat vector has {flat.numel()} elements, the model has {numel} parameters")
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(flat.reshape(-1).to(next(model.parameters()).dtype), model.parameters())
    return model


@torch.no_grad()
def accuracy(model: nn.Module, dataset) -> float:
    """Fraction of `dataset` (x, y) whose arg-max logit is the label."""
    x, y = dataset
    return (model(x).argmax(-1) == y).float().mean().item()
