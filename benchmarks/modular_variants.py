"""Generated stand-ins for Larochelle et al.'s MNIST variations and shape sets (spec A3.5).

The originals (mnist-rot, mnist-back-rand, rectangles, convex) are not available offline. These
follow their published descriptions; the paper's numbers are therefore not directly comparable,
only the order of the methods is.

* rotated: an MNIST digit rotated by an angle uniform in [0, 2π) (bilinear, same 28 x 28 frame).
* random_background: an MNIST digit whose background pixels (value 0) are uniform noise in [0, 1].
* rectangles: the white outline of a random rectangle, label 1 if taller than wide
  (|height - width| > 3 pixels).
* convex: a filled white region, label 1 if it is convex (an intersection of random half-planes)
  and 0 if it is not (the union of two such regions whose union fills less than 90% of its
  convex hull).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from bench_data import load_mnist
from scipy import ndimage
from scipy.spatial import ConvexHull, Delaunay

SIDE = 28
_GRID = np.stack(np.meshgrid(np.arange(SIDE), np.arange(SIDE), indexing="ij"), -1).reshape(-1, 2)


def _digits(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    x, y = load_mnist()
    rows = rng.choice(len(x), n, replace=False)
    return x[rows].astype(np.float64) / 255.0, y[rows].astype(np.int64)


def rotated(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    x, y = _digits(n, rng)
    angles = rng.uniform(0.0, 360.0, n)
    images = [
        ndimage.rotate(img.reshape(SIDE, SIDE), a, reshape=False, order=1)
        for img, a in zip(x, angles, strict=True)
    ]
    return np.clip(np.array(images).reshape(n, -1), 0.0, 1.0), y


def random_background(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    x, y = _digits(n, rng)
    noise = rng.uniform(0.0, 1.0, x.shape)
    return np.where(x > 0, x, noise), y


def rectangles(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    images = np.zeros((n, SIDE, SIDE))
    labels = np.empty(n, dtype=np.int64)
    for i in range(n):
        while True:
            h, w = rng.integers(4, SIDE - 1, 2)
            if abs(h - w) > 3:
                break
        top, left = rng.integers(0, SIDE - h + 1), rng.integers(0, SIDE - w + 1)
        img = images[i]
        img[top, left : left + w] = img[top + h - 1, left : left + w] = 1.0
        img[top : top + h, left] = img[top : top + h, left + w - 1] = 1.0
        labels[i] = int(h > w)
    return images.reshape(n, -1), labels


def _convex_region(rng: np.random.Generator) -> np.ndarray:
    """Pixels inside the intersection of random half-planes around a random centre."""
    while True:
        centre = rng.uniform(6, SIDE - 6, 2)
        inside = np.ones(len(_GRID), dtype=bool)
        for _ in range(rng.integers(3, 8)):
            angle = rng.uniform(0, 2 * np.pi)
            normal = np.array([np.cos(angle), np.sin(angle)])
            inside &= (_GRID - centre) @ normal <= rng.uniform(3, 12)
        if inside.sum() >= 20:
            return inside


def _hull_fill(inside: np.ndarray) -> float:
    points = _GRID[inside].astype(np.float64)
    hull = Delaunay(points[ConvexHull(points).vertices])
    return inside.sum() / max(1, int(np.sum(hull.find_simplex(_GRID) >= 0)))


def convex(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    images = np.zeros((n, SIDE * SIDE))
    labels = rng.integers(0, 2, n)
    for i in range(n):
        if labels[i]:
            images[i] = _convex_region(rng)
            continue
        while True:
            union = _convex_region(rng) | _convex_region(rng)
            if _hull_fill(union) < 0.9:
                images[i] = union
                break
    return images, labels


VARIANTS: dict[str, Callable[[int, np.random.Generator], tuple[np.ndarray, np.ndarray]]] = {
    "rotated": rotated,
    "random_background": random_background,
    "rectangles": rectangles,
    "convex": convex,
}
