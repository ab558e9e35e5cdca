"""MBN on one NVIDIA GPU: every layer's codes computed there, the CPU's codes bit for bit.

``MBN(device="cuda")`` fits and encodes through ``CudaBackend`` (``backend``), the backend
registered here as "cuda". The array code is ``arrays``, written against a namespace ``xp``:
CuPy here, numpy in the tests, where the same runner runs on the CPU. Three steps have CUDA
kernels of their own (``kernels``, their CUDA C in ``kernels.cu``). CuPy is imported lazily
(``device``); without it (the ``gpu`` extra) or without a visible GPU, ``device="cuda"`` is
refused with a ValueError that says so.

Memory: the input is uploaded in row blocks that fit the budget (``device.device_budget``),
and each bottom clustering is scored block by block (``bottom``), so the data need not fit on
the card; the upper layers (``upper``) hold the (n, V) codes and their posting lists on the
device (``device.upper_rows_capacity``).
"""

from mbn_core.mbn.backends.base import register_backend
from mbn_core.mbn.backends.cuda.backend import CudaBackend, numpy_backend
from mbn_core.mbn.backends.cuda.bottom import bottom_layer_codes
from mbn_core.mbn.backends.cuda.device import (
    DEVICES,
    INSTALL_HINT,
    device_budget,
    device_name,
    gpu_count,
    gpu_present,
    require_cupy,
    require_gpu,
    resolve_device,
    upper_rows_capacity,
)
from mbn_core.mbn.backends.cuda.kernels import kernels_in_use
from mbn_core.mbn.backends.cuda.upper import (
    ArrayCounting,
    KernelCounting,
    SharedCodeCounting,
    clusterings_per_group,
    kernel_counting,
    upper_layer_codes,
)

register_backend(
    CudaBackend.name,
    CudaBackend,
    device="cuda",
    description="one NVIDIA GPU through CuPy, the CPU's codes bit for bit",
    require=require_gpu,
)

__all__ = [
    "DEVICES",
    "INSTALL_HINT",
    "ArrayCounting",
    "CudaBackend",
    "KernelCounting",
    "SharedCodeCounting",
    "bottom_layer_codes",
    "clusterings_per_group",
    "device_budget",
    "device_name",
    "gpu_count",
    "gpu_present",
    "kernel_counting",
    "kernels_in_use",
    "numpy_backend",
    "require_cupy",
    "require_gpu",
    "resolve_device",
    "upper_layer_codes",
    "upper_rows_capacity",
]
