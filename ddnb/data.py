"""Small datasets as tensors, and the deterministic sampling every rank can replay.

    train, test = digits()                        # 8x8 handwritten digits, standardized
    part = shard(train, rank=1, num_shards=4)     # worker 1's quarter, disjoint from the others
    x, y = batch(part, batch_size=32, step=7, seed=0)

`digits` is scikit-learn's copy of the UCI "Optical Recognition of Handwritten Digits"
test set (1,797 images of 8x8 pixels, 10 classes; Alpaydin & Kaynak 1998), shipped inside
scikit-learn, so nothing is downloaded. `batch` is a pure function of (dataset, step,
seed): a worker, a server and a single-process reference all draw the same examples for
the same step, which is what makes the distributed-vs-single-process tests exact.
Used from `notebooks/04_parameter_server.ipynb` on.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ddnb._checks import Checks


@dataclass(frozen=True)
class Dataset:
    """Examples x (n, ...) float32 and labels y (n,) int64, as tensors."""

    x: torch.Tensor
    y: torch.Tensor

    def __post_init__(self):
        if len(self.x) != len(self.y):
            raise ValueError(f"x has {len(self.x)} examples but y has {len(self.y)} labels")

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, idx) -> "Dataset":
        return Dataset(self.x[idx], self.y[idx])

    def __iter__(self):  # x, y = dataset
        return iter((self.x, self.y))


def digits(test_size: float = 0.25, seed: int = 0) -> tuple[Dataset, Dataset]:
    """(train, test) splits of scikit-learn's handwritten digits: x (n, 64) float32
    standardized with the train split's per-pixel mean and std (pixels that are constant
    in train keep std 1), y (n,) int64 in 0..9. The split is stratified and seeded."""
    with Checks("digits") as check:
        check.number("test_size", test_size, positive=True, below=1, why=" (a fraction)")
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)                      # (1797, 64) in 0..16, (1797,)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=test_size, random_state=seed, stratify=y)
    x_tr, x_te = torch.tensor(x_tr, dtype=torch.float32), torch.tensor(x_te, dtype=torch.float32)
    mean, std = x_tr.mean(0), x_tr.std(0)                    # (64,), (64,)
    std = torch.where(std > 0, std, torch.ones_like(std))
    return (Dataset((x_tr - mean) / std, torch.tensor(y_tr, dtype=torch.int64)),
            Dataset((x_te - mean) / std, torch.tensor(y_te, dtype=torch.int64)))


def shard(dataset: Dataset, rank: int, num_shards: int) -> Dataset:
    """Part `rank` of `num_shards` disjoint parts that cover the dataset: examples
    rank, rank + num_shards, rank + 2·num_shards, ... (sizes differ by at most one)."""
    with Checks("shard") as check:
        if check.integer("num_shards", num_shards, min=1):
            check.integer("rank", rank, min=0, max=num_shards - 1, why=f" (0 <= rank < num_shards={num_shards})")
            check.rule(len(dataset) >= num_shards, f"{len(dataset)} examples cannot make {num_shards} non-empty "
                                                   f"shards")
    return dataset[rank::num_shards]


def batch_indices(n: int, batch_size: int, step: int, seed: int) -> torch.Tensor:
    """Indices (batch_size,) of batch `step` when `n` examples are visited in epochs,
    each a fresh permutation seeded by (seed, epoch), cut into n // batch_size batches
    (the remainder of each permutation is dropped, as DataLoader's drop_last does)."""
    with Checks("batch_indices") as check:
        if check.integer("n", n, min=1, why=" (examples)"):
            check.integer("batch_size", batch_size, min=1, max=n, why=" (at most the n examples)")
        check.integer("step", step, min=0)
    per_epoch = n // batch_size
    epoch, i = divmod(step, per_epoch)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(1_000_003 * seed + epoch))
    return perm[i * batch_size:(i + 1) * batch_size]


def batch(dataset: Dataset, batch_size: int, step: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) of batch `step` of `dataset` (see `batch_indices`)."""
    idx = batch_indices(len(dataset), batch_size, step, seed)
    return dataset.x[idx], dataset.y[idx]
