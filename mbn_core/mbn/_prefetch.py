"""A software prefetch for numba kernels: ``prefetch(array, index)`` asks the CPU to bring
``array[index]``'s cache line in, and returns at once.

Hardware prefetchers follow sequential runs; they cannot guess where the next of hundreds of
scattered posting lists starts, so a kernel that reads such lists one after another waits for
memory on each. Named a few lists ahead, the loads overlap. It is LLVM's ``llvm.prefetch``
(read, high locality, data cache): a hint with no effect on any result, and nothing on a
target without such an instruction.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

_READ = 0
_KEEP_IN_ALL_CACHES = 3
_DATA = 1


@intrinsic
def _prefetch(typingctx, array, index):
    """Prefetch ``array[index]`` (a C-contiguous 1-D array; the index is not checked: a hint
    past the end reads nothing)."""
    signature = types.void(array, index)

    def codegen(context, builder, sig, args):
        array_type, _ = sig.args
        data = context.make_array(array_type)(context, builder, args[0]).data
        address = builder.bitcast(builder.gep(data, [args[1]]), ir.IntType(8).as_pointer())
        int32 = ir.IntType(32)
        function_type = ir.FunctionType(ir.VoidType(), [address.type, int32, int32, int32])
        function = builder.module.declare_intrinsic("llvm.prefetch", fnty=function_type)
        flags = [ir.Constant(int32, value) for value in (_READ, _KEEP_IN_ALL_CACHES, _DATA)]
        builder.call(function, [address, *flags])
        return context.get_dummy_value()

    return signature, codegen


# Called from numba code as ``prefetch(array, index)`` (numba supplies the typing context).
prefetch = cast(Callable[[Any, Any], None], _prefetch)


@njit(inline="always")
def prefetch_row(matrix, row):
    """Ask for every cache line of C-contiguous ``matrix``'s row ``row``."""
    width = matrix.shape[1]
    step = max(1, 64 // matrix.itemsize)
    for p in range(row * width, (row + 1) * width, step):
        prefetch(matrix, p)
