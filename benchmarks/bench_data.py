"""Where the benchmarks find their data: MNIST through one documented loader.

``load_mnist()`` looks, in order, at
1. the ``path`` argument or the ``MBN_MNIST`` environment variable: an ``.npz`` with ``x``
   (uint8, n x 784) and ``y`` (the digits), such as the 70,000 shuffled digits the figures in
   docs/BENCHMARKS.md were measured on (train/test = first 60,000 / last 10,000 rows);
2. a cached copy in ``MBN_DATA_CACHE`` (default ``~/.cache/mbn``), written by step 3;
3. scikit-learn's ``fetch_openml("mnist_784")`` (one public download, cached by scikit-learn
   too), merged and shuffled with a fixed seed, then saved to the cache as ``mnist70k.npz``.

A copy from step 3 holds the same 70,000 images as the one the figures used, in another order,
so figures that depend on the split can move slightly.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

SHUFFLE_SEED = 0
CACHE_NAME = "mnist70k.npz"


def cache_dir() -> Path:
    return Path(os.environ.get("MBN_DATA_CACHE", Path.home() / ".cache" / "mbn"))


def load_mnist(path: str | os.PathLike[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """All 70,000 MNIST digits as (x uint8 n x 784, y uint8 n); see the module docstring."""
    explicit = path or os.environ.get("MBN_MNIST")
    if explicit:
        return _read(Path(explicit))
    cached = cache_dir() / CACHE_NAME
    if cached.exists():
        return _read(cached)
    x, y = _download()
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = cached.with_suffix(".partial.npz")
    np.savez_compressed(partial, x=x, y=y)
    partial.replace(cached)
    return x, y


def _read(path: Path) -> tuple[np.ndarray, np.ndarray]:
    if not path.exists():
        raise FileNotFoundError(f"MNIST file {path} does not exist (MBN_MNIST or --data)")
    with np.load(path, allow_pickle=False) as data:
        return data["x"], data["y"]


def _download() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import fetch_openml

    bunch = fetch_openml(
        "mnist_784", version=1, as_frame=False, parser="liac-arff", data_home=str(cache_dir())
    )
    x = np.asarray(bunch.data, dtype=np.uint8)
    y = np.asarray(bunch.target).astype(np.uint8)
    order = np.random.default_rng(SHUFFLE_SEED).permutation(len(x))
    return x[order], y[order]


def topic_corpus(
    n_documents: int,
    vocabulary: int = 30_000,
    n_topics: int = 10,
    words_per_document: int = 20,
    seed: int = 0,
):
    """A labelled bag-of-words stand-in: (CSR float32 n x vocabulary, topic labels).

    No text corpus is on this machine (20 newsgroups is a download), so sparse input is
    measured on documents drawn from ``n_topics`` word distributions: Zipf word frequencies
    (exponent 1.1) shared by all topics, with 2% of the vocabulary 3 times as likely in each
    topic and a Gamma(1) draw per word and topic; lengths 1 + Poisson(20) words (short texts:
    k-means on 10 truncated-SVD dimensions of 2,000 of them scores NMI 0.58, where longer ones
    approach 1); values log(1 + count). The topic is the label. The draws depend on ``seed``
    only, and the topics on nothing else, so two calls with different document counts share
    the topics when their seeds do.
    """
    import scipy.sparse as sp

    topics_rng = np.random.RandomState(seed)
    zipf = 1 / np.arange(1, vocabulary + 1) ** 1.1
    topics = []
    for _ in range(n_topics):
        boost = np.ones(vocabulary)
        boost[topics_rng.choice(vocabulary, vocabulary // 50, replace=False)] = 3.0
        weights = zipf * boost * topics_rng.gamma(1.0, 1.0, vocabulary)
        topics.append(weights / weights.sum())
    rng = np.random.RandomState(seed + 1)
    labels = rng.randint(n_topics, size=n_documents)
    rows, columns, counts = [], [], []
    for i, topic in enumerate(labels):
        drawn = rng.multinomial(rng.poisson(words_per_document) + 1, topics[topic])
        words = np.flatnonzero(drawn)
        rows.append(np.full(len(words), i))
        columns.append(words)
        counts.append(drawn[words])
    values = np.log1p(np.concatenate(counts)).astype(np.float32)
    X = sp.csr_matrix(
        (values, (np.concatenate(rows), np.concatenate(columns))),
        shape=(n_documents, vocabulary),
    )
    return X, labels
