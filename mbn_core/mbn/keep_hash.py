"""Which one-hot dimensions an upper clustering keeps: splitmix64, its constants written once.

Clustering v of an upper layer keeps the one-hot dimension ``key`` when
``splitmix64(seed_v, key) < keep_threshold(feature_fraction)``. Three implementations compute
it, one per place the layers run, and must agree bit for bit:

- the numba kernels (``mbn_core.mbn._kernels``, CPU and Dask);
- the array code (``mbn_core.mbn.backends.cuda.arrays``, CuPy or numpy);
- the CUDA C kernels (``mbn_core/mbn/backends/cuda/kernels.cu``), which get these constants
  as ``#define``s (``cuda_defines``) when they are compiled.

The constants and shifts are the ones below, and nowhere else; the tests run all three on
the same keys (the CUDA C with the host's C compiler, and with NVRTC where there is one).
"""

from __future__ import annotations

import numpy as np

# splitmix64 (Steele, Lea & Flood 2014): a stateless, well-mixed 64-bit hash.
# z = seed + key * GOLDEN; z = (z ^ z >> S1) * MIX1; z = (z ^ z >> S2) * MIX2; z ^ z >> S3
GOLDEN = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB
SHIFTS = (30, 27, 31)


def keep_threshold(fraction: float) -> np.uint64:
    """Hash threshold that keeps a one-hot dimension with probability ``fraction``."""
    return np.uint64(min(int(fraction * 2.0**64), 2**64 - 1))


def cuda_defines() -> str:
    """The constants as the C preprocessor lines that ``kernels.cu`` expects."""
    s1, s2, s3 = SHIFTS
    return "\n".join(
        [
            f"#define SPLITMIX_GOLDEN 0x{GOLDEN:016X}ull",
            f"#define SPLITMIX_MIX1 0x{MIX1:016X}ull",
            f"#define SPLITMIX_MIX2 0x{MIX2:016X}ull",
            f"#define SPLITMIX_SHIFT1 {s1}",
            f"#define SPLITMIX_SHIFT2 {s2}",
            f"#define SPLITMIX_SHIFT3 {s3}",
            "",
        ]
    )
