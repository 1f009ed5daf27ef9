"""Which framework a tensor belongs to, and how to allocate and find streams with it.

flashcpp's native module only views memory; every output and workspace buffer is allocated
here with the input's own framework (numpy.empty, torch.empty, cupy.empty, or the array API
namespace's ``empty``), on the input's device. No framework is imported by this module: a
framework is recognised only when the caller has already imported it.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Optional, Sequence, Tuple

# DLPack device types (dlpack.h): kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13.
_DLPACK_CUDA_TYPES = (2, 13)


def shape_of(x: Any, name: str) -> Tuple[int, ...]:
    """The shape of an array-like, or TypeError naming the argument."""
    shape = getattr(x, "shape", None)
    if shape is None and hasattr(x, "__cuda_array_interface__"):
        shape = x.__cuda_array_interface__["shape"]
    if shape is None or isinstance(x, (list, tuple)):
        raise TypeError(
            f"{name}: expected an array or tensor (DLPack, buffer protocol or "
            f"__cuda_array_interface__), got {type(x).__name__}"
        )
    return tuple(int(s) for s in shape)


class Framework:
    """Default behaviour: the array API standard (``__array_namespace__``)."""

    name = "array-api"

    def prepare(self, x: Any) -> Any:
        """What to hand to the native module for `x`."""
        return x

    def is_cuda(self, x: Any) -> bool:
        if hasattr(x, "__dlpack_device__"):
            return int(x.__dlpack_device__()[0]) in _DLPACK_CUDA_TYPES
        return hasattr(x, "__cuda_array_interface__")

    def empty(self, like: Any, shape: Sequence[int], dtype: Optional[str] = None) -> Any:
        """A new array on like's device; dtype None means like's dtype, else 'float32'/'uint8'."""
        namespace = getattr(like, "__array_namespace__", None)
        if namespace is None:
            raise TypeError(
                f"flashcpp cannot allocate outputs for {type(like).__module__}."
                f"{type(like).__name__}: pass out= (and lse_out= / dq=, dk=, dv=) allocated "
                "by your framework"
            )
        xp = namespace()
        kind = like.dtype if dtype is None else getattr(xp, dtype)
        device = getattr(like, "device", None)
        if device is None:
            return xp.empty(tuple(shape), dtype=kind)
        return xp.empty(tuple(shape), dtype=kind, device=device)

    def default_stream(self, like: Any) -> int:
        """The stream the caller's framework is working on; 0 is CUDA's legacy default stream."""
        return 0

    def device_guard(self, like: Any):
        return contextlib.nullcontext()

    def stream_scope(self, like: Any, stream: Optional[int]):
        """Allocations inside belong to `stream` (a cudaStream_t), where the framework's
        allocator is stream-ordered; None keeps the current stream."""
        return contextlib.nullcontext()


class NumpyFramework(Framework):
    name = "numpy"

    def __init__(self, np):
        self.np = np

    def is_cuda(self, x: Any) -> bool:
        return False

    def empty(self, like, shape, dtype=None):
        return self.np.empty(tuple(shape), dtype=like.dtype if dtype is None else dtype)


class TorchFramework(Framework):
    name = "torch"

    def __init__(self, torch):
        self.torch = torch

    def prepare(self, x):
        # DLPack refuses tensors that require grad; flashcpp only reads them.
        return x.detach() if x.requires_grad else x

    def is_cuda(self, x):
        return x.is_cuda

    def empty(self, like, shape, dtype=None):
        kind = like.dtype if dtype is None else getattr(self.torch, dtype)
        return self.torch.empty(tuple(shape), dtype=kind, device=like.device)

    def default_stream(self, like):
        if like.is_cuda:
            return self.torch.cuda.current_stream(like.device).cuda_stream
        return 0

    def device_guard(self, like):
        if like.is_cuda and like.device.index != self.torch.cuda.current_device():
            return self.torch.cuda.device(like.device)
        return contextlib.nullcontext()

    def stream_scope(self, like, stream):
        if stream is None or not like.is_cuda:
            return contextlib.nullcontext()
        return self.torch.cuda.stream(self.torch.cuda.ExternalStream(stream, device=like.device))


class CupyFramework(Framework):
    name = "cupy"

    def __init__(self, cupy):
        self.cupy = cupy

    def is_cuda(self, x):
        return True

    def empty(self, like, shape, dtype=None):
        with like.device:
            return self.cupy.empty(tuple(shape), dtype=like.dtype if dtype is None else dtype)

    def default_stream(self, like):
        with like.device:
            return int(self.cupy.cuda.get_current_stream().ptr)

    def device_guard(self, like):
        return like.device

    def stream_scope(self, like, stream):
        if stream is None:
            return contextlib.nullcontext()
        return self.cupy.cuda.ExternalStream(stream)


_GENERIC = Framework()


def framework_of(x: Any) -> Framework:
    """The framework `x` belongs to, among those the caller has imported."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return TorchFramework(torch)
    np = sys.modules.get("numpy")
    if np is not None and isinstance(x, np.ndarray):
        return NumpyFramework(np)
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(x, cupy.ndarray):
        return CupyFramework(cupy)
    return _GENERIC


def stream_handle(stream: Any) -> int:
    """An int CUDA stream handle from an int, a torch.cuda.Stream or a cupy Stream."""
    if isinstance(stream, int):
        return stream
    for attribute in ("cuda_stream", "ptr"):
        handle = getattr(stream, attribute, None)
        if isinstance(handle, int):
            return handle
    raise TypeError(
        "stream: expected an int (cudaStream_t), a torch.cuda.Stream or a cupy Stream, "
        f"got {type(stream).__name__}"
    )
