"""A generated image dataset, encoded as real JPEG (or PNG) files: made here, nothing downloaded.

    samples = make_images(10_000, size=32, seed=0)     # [Sample(key, data, label), ...]
    image = decode(samples[0].data)                    # uint8 (3, 32, 32)
    x = augment(image, seed=7)                         # float32 (3, 32, 32): crop, flip, standardize

Each sample is a pure function of (index, seed): a class-dependent pattern (label = index
mod 10: stripes whose frequency and angle depend on the label, a colour per label) plus
Gaussian noise, encoded by Pillow. JPEG at quality 90 gives ~1 KB per 32x32 sample, so
10,000 samples are ~10 MB, generated in a second or two. The augmentation is the one of
CIFAR training since He et al. 2016 ("Deep Residual Learning", Sec. 4.2): pad 4, random
32x32 crop, random horizontal flip, then per-channel standardization.
Taught in `notebooks/01b_data_pipeline.ipynb`.
"""
from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import torch

from ddnb._checks import Checks

ENCODINGS = ("JPEG", "PNG")


@dataclass(frozen=True)
class Sample:
    """One stored sample: key (a zero-padded index, '000042'), data (the encoded image bytes), label."""

    key: str
    data: bytes
    label: int


def _pixels(n: int, size: int, seed: int) -> np.ndarray:
    """uint8 (n, size, size, 3): label-dependent stripes and colour plus noise."""
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % 10                                   # (n,)
    yy, xx = np.mgrid[0:size, 0:size] / size                     # (size, size) each
    angle = labels[:, None, None] * (np.pi / 10)                 # (n, 1, 1)
    freq = 2 + labels[:, None, None] % 5                         # (n, 1, 1)
    wave = np.sin(2 * np.pi * freq * (xx * np.cos(angle) + yy * np.sin(angle)))   # (n, size, size)
    hue = np.stack([np.cos(labels), np.sin(labels), np.cos(2 * labels)], -1)      # (n, 3)
    img = 128 + 60 * wave[..., None] * (0.6 + 0.4 * hue[:, None, None, :])        # (n, size, size, 3)
    img = img + rng.normal(0, 20, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def make_images(n: int, size: int = 32, seed: int = 0, encoding: str = "JPEG", quality: int = 90) -> list[Sample]:
    """n samples of size x size RGB, encoded with Pillow (JPEG at `quality`, or PNG)."""
    with Checks("make_images") as check:
        check.integer("n", n, min=1)
        check.integer("size", size, min=8, max=1024)
        check.integer("seed", seed)
        check.choice("encoding", encoding, ENCODINGS)
        check.integer("quality", quality, min=1, max=100)
    from PIL import Image

    pixels = _pixels(n, size, seed)
    out = []
    for i in range(n):
        buf = io.BytesIO()
        kw = {"quality": quality} if encoding == "JPEG" else {}
        Image.fromarray(pixels[i]).save(buf, format=encoding, **kw)
        out.append(Sample(f"{i:06d}", buf.getvalue(), i % 10))
    return out


def decode(data: bytes) -> torch.Tensor:
    """Encoded image bytes -> uint8 (3, H, W), decoded by Pillow."""
    from PIL import Image

    arr = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))   # (H, W, 3)
    return torch.from_numpy(arr.copy()).permute(2, 0, 1)           # (3, H, W)


def augment(image: torch.Tensor, seed: int, pad: int = 4) -> torch.Tensor:
    """uint8 (3, H, W) -> float32 (3, H, W): pad `pad` (reflect), a random HxW crop, a random
    horizontal flip (both drawn from `seed`), then per-channel standardization."""
    g = torch.Generator().manual_seed(seed)
    _, h, w = image.shape
    x = torch.nn.functional.pad(image.float()[None], (pad, pad, pad, pad), mode="reflect")[0]  # (3, H+2p, W+2p)
    i, j = (int(v) for v in torch.randint(0, 2 * pad + 1, (2,), generator=g))
    x = x[:, i:i + h, j:j + w]                                                     # (3, H, W)
    if bool(torch.rand((), generator=g) < 0.5):
        x = x.flip(-1)
    mean, std = x.mean((1, 2), keepdim=True), x.std((1, 2), keepdim=True)          # (3, 1, 1)
    return (x - mean) / std.clamp_min(1e-6)
