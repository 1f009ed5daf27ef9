"""Which framework a tensor belongs to, and how to allocate and find streams with it.

flashcpp's native module only views memory; every output and workspace buffer is allocated
here with the input's own framework (numpy.empty, torch.empty, cupy.empty, or the array API
namespace's ``empty``), on the input's device. No framework is imported by this module: a
framework is recognised only when the caller has already imported it.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

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
    return tuple(map(int, shape))


class Framework:
    """Default behaviour: the array API standard (``__array_namespace__``)."""

    name = "array-api"

    def prepare(self, x: Any) -> Any:
        """What to hand to the native module for `x`."""
        return x

    # _native's `export`: what the native module is handed for a prepared array, once per
    # native call; None hands the array itself over.
    export: Optional[Callable[[Any], Any]] = None

    def is_cuda(self, x: Any) -> bool:
        if hasattr(x, "__dlpack_device__"):
            return int(x.__dlpack_device__()[0]) in _DLPACK_CUDA_TYPES
        return hasattr(x, "__cuda_array_interface__")

    @staticmethod
    def _namespace(like: Any) -> Any:
        namespace = getattr(like, "__array_namespace__", None)
        if namespace is None:
            raise TypeError(
                f"flashcpp cannot allocate outputs for {type(like).__module__}."
                f"{type(like).__name__}: pass out= (and lse_out= / dq=, dk=, dv=; "
                "cache_seqlens as an array) allocated by your framework"
            )
        return namespace()

    def empty(self, like: Any, shape: Sequence[int], dtype: Optional[str] = None) -> Any:
        """A new array on like's device; dtype None means like's dtype, else 'float32'/'uint8'."""
        xp = self._namespace(like)
        kind = like.dtype if dtype is None else getattr(xp, dtype)
        device = getattr(like, "device", None)
        if device is None:
            return xp.empty(tuple(shape), dtype=kind)
        return xp.empty(tuple(shape), dtype=kind, device=device)

    def zeros(self, like: Any, shape: Sequence[int]) -> Any:
        """A new array of zeros of like's dtype on like's device."""
        xp = self._namespace(like)
        device = getattr(like, "device", None)
        if device is None:
            return xp.zeros(tuple(shape), dtype=like.dtype)
        return xp.zeros(tuple(shape), dtype=like.dtype, device=device)

    def full(self, like: Any, shape: Sequence[int], value: Any, dtype: str) -> Any:
        """A new array of `value` on like's device, of dtype 'int32' (cache lengths) or
        'float32' (-inf lse rows)."""
        xp = self._namespace(like)
        device = getattr(like, "device", None)
        if device is None:
            return xp.full(tuple(shape), value, dtype=getattr(xp, dtype))
        return xp.full(tuple(shape), value, dtype=getattr(xp, dtype), device=device)

    def default_stream(self, like: Any) -> int:
        """The stream the caller's framework is working on; 0 is CUDA's legacy default stream."""
        return 0

    def device_guard(self, like: Any):
        return contextlib.nullcontext()

    def stream_scope(self, like: Any, stream: Optional[int]):
        """Allocations inside belong to `stream` (a cudaStream_t), where the framework's
        allocator is stream-ordered; None keeps the current stream."""
        return contextlib.nullcontext()

    def autograd_ops(self, q: Any, k: Any, v: Any) -> Any:
        """The module whose functions take the call over where a direct native call cannot
        serve it (autograd, a tracing compiler), else None."""
        return None


class NumpyFramework(Framework):
    name = "numpy"

    def __init__(self, np):
        self.np = np

    def is_cuda(self, x: Any) -> bool:
        return False

    def empty(self, like, shape, dtype=None):
        return self.np.empty(tuple(shape), dtype=like.dtype if dtype is None else dtype)

    def zeros(self, like, shape):
        return self.np.zeros(tuple(shape), dtype=like.dtype)

    def full(self, like, shape, value, dtype):
        return self.np.full(tuple(shape), value, dtype=dtype)


class TorchFramework(Framework):
    name = "torch"

    def __init__(self, torch):
        self.torch = torch
        self.tensor_type = torch.Tensor
        self.to_dlpack = torch.utils.dlpack.to_dlpack
        self.is_compiling = torch.compiler.is_compiling
        self.is_grad_enabled = torch.is_grad_enabled
        self.export = self._export

    def _export(self, x):
        # A plain tensor's DLPack capsule straight from torch's C++ (to_dlpack): the same capsule
        # as Tensor.__dlpack__() (stream -1: no synchronisation) without that Python method's
        # cost. Anything else (a subclass with __torch_function__, a tensor that requires grad,
        # which DLPack refuses, a sparse one) goes to the native module as it is, which reports
        # it naming the argument.
        if type(x) is not self.tensor_type or x.requires_grad:
            return x
        try:
            return self.to_dlpack(x)
        except (RuntimeError, BufferError, TypeError):
            return x

    def prepare(self, x):
        # DLPack refuses tensors that require grad; flashcpp only reads them.
        return x.detach() if x.requires_grad else x

    def is_cuda(self, x):
        return x.is_cuda

    def empty(self, like, shape, dtype=None):
        # new_empty: like's device and dtype without building a torch.device per call
        if dtype is None:
            return like.new_empty(tuple(shape))
        return like.new_empty(tuple(shape), dtype=getattr(self.torch, dtype))

    def zeros(self, like, shape):
        return self.torch.zeros(tuple(shape), dtype=like.dtype, device=like.device)

    def full(self, like, shape, value, dtype):
        return self.torch.full(tuple(shape), value, dtype=getattr(self.torch, dtype),
                               device=like.device)

    def default_stream(self, like):
        if like.is_cuda:
            return self.torch.cuda.current_stream(like.device).cuda_stream
        return 0

    def device_guard(self, like):
        if like.is_cuda and like.device.index != self.torch.cuda.current_device():
            return self.torch.cuda.device(like.device)
        return _NO_GUARD

    def stream_scope(self, like, stream):
        if stream is None or not like.is_cuda:
            return contextlib.nullcontext()
        return self.torch.cuda.stream(self.torch.cuda.ExternalStream(stream, device=like.device))

    def autograd_ops(self, q, k, v):
        # Tensors that need autograd, or that torch.compile is tracing, take the custom ops of
        # flashcpp.torch (a direct native call would be a graph break). torch is imported
        # already: q is one of its tensors.
        if self.is_compiling() or (
                (q.requires_grad or getattr(k, "requires_grad", False)
                 or getattr(v, "requires_grad", False)) and self.is_grad_enabled()):
            from . import torch as flashcpp_torch  # noqa: PLC0415

            return flashcpp_torch
        return None


class CupyFramework(Framework):
    name = "cupy"

    def __init__(self, cupy):
        self.cupy = cupy

    def is_cuda(self, x):
        return True

    def empty(self, like, shape, dtype=None):
        with like.device:
            return self.cupy.empty(tuple(shape), dtype=like.dtype if dtype is None else dtype)

    def zeros(self, like, shape):
        with like.device:
            return self.cupy.zeros(tuple(shape), dtype=like.dtype)

    def full(self, like, shape, value, dtype):
        with like.device:
            return self.cupy.full(tuple(shape), value, dtype=dtype)

    def default_stream(self, like):
        with like.device:
            return int(self.cupy.cuda.get_current_stream().ptr)

    def device_guard(self, like):
        return like.device

    def stream_scope(self, like, stream):
        if stream is None:
            return contextlib.nullcontext()
        return self.cupy.cuda.ExternalStream(stream)


class JaxFramework(Framework):
    """JAX tracers (under jax.jit, jax.grad, jax.vmap), which hold no data: the call becomes
    flashcpp.jax's XLA custom calls. Concrete JAX arrays take the generic DLPack path."""

    name = "jax"

    def autograd_ops(self, q, k, v):
        from . import jax as flashcpp_jax  # noqa: PLC0415 (imports jax, already imported)

        return flashcpp_jax


_GENERIC = Framework()
# A nullcontext to reuse: entering and leaving it keeps no state.
_NO_GUARD = contextlib.nullcontext()

# The framework of each array type seen so far: a type's framework never changes (a torch.Tensor
# type cannot exist before torch is imported, and the generic answer holds for a type of no
# known framework even if one is imported later, since isinstance of that type stays False).
_framework_by_type: Dict[type, Framework] = {}


def framework_of(x: Any) -> Framework:
    """The framework `x` belongs to, among those the caller has imported."""
    kind = type(x)
    framework = _framework_by_type.get(kind)
    if framework is None:
        framework = _framework_of_new_type(x)
        _framework_by_type[kind] = framework
    return framework


def _framework_of_new_type(x: Any) -> Framework:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return _shared(TorchFramework, torch)
    np = sys.modules.get("numpy")
    if np is not None and isinstance(x, np.ndarray):
        return _shared(NumpyFramework, np)
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(x, cupy.ndarray):
        return _shared(CupyFramework, cupy)
    jax = sys.modules.get("jax")
    tracer = getattr(getattr(jax, "core", None), "Tracer", None)
    if tracer is not None and isinstance(x, tracer):
        return JaxFramework()
    return _GENERIC


_instances: Dict[type, Framework] = {}


def _shared(kind: type, module: Any) -> Framework:
    """One adapter per framework, shared by its array types (torch.Tensor, nn.Parameter, ...)."""
    if kind not in _instances:
        _instances[kind] = kind(module)
    return _instances[kind]


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


# ---- __cuda_array_interface__ version 3: the producer's stream -------------------------------
# The "stream" entry names the stream on which the producer's work on the data is ordered: an
# int cudaStream_t, 1 for the legacy default stream, 2 for the per-thread default stream, None
# (or absent) when the data needs no synchronisation; 0 is disallowed (it would be ambiguous).
# The consumer must order its own work after that stream before it touches the data. flashcpp
# keeps its launch stream (stream=, else the framework's current stream, else the legacy
# default stream) and makes that stream wait for each producer's stream: an event recorded on
# the producer's stream and waited for on the launch stream, so the host does not block.
_LEGACY_DEFAULT = (0, 1)  # flashcpp's stream 0 and CAI's 1 are both the legacy default stream


def reads_cuda_array_interface(x: Any) -> bool:
    """True when the native module reads x through __cuda_array_interface__: it takes DLPack
    first (PyTorch and CuPy export both). __dlpack__ is asked about first: PyTorch's
    __cuda_array_interface__ raises RuntimeError for a tensor that requires grad."""
    return not hasattr(x, "__dlpack__") and hasattr(x, "__cuda_array_interface__")


def cuda_array_interface_stream(x: Any, name: str) -> Optional[int]:
    """The producer's stream of x when flashcpp reads it through __cuda_array_interface__ and
    the interface names one, else None. Raises for the disallowed 0 and for non-int values."""
    if not reads_cuda_array_interface(x):
        return None
    stream = x.__cuda_array_interface__.get("stream")
    if stream is None:
        return None
    if isinstance(stream, bool) or not isinstance(stream, int):
        raise TypeError(f"{name}: __cuda_array_interface__ stream must be an int or None, got "
                        f"{type(stream).__name__}")
    if stream == 0:
        from ._C import Error  # noqa: PLC0415 (the native module defines flashcpp.Error)

        raise Error(f"{name}: __cuda_array_interface__ stream 0 is disallowed by the interface "
                    "(ambiguous); producers give 1 (legacy default), 2 (per-thread default) "
                    "or a stream handle")
    return stream


def _same_stream(a: int, b: int) -> bool:
    return a == b or (a in _LEGACY_DEFAULT and b in _LEGACY_DEFAULT)


def order_after_producers(arrays: Dict[str, Any], launch: int) -> None:
    """Makes stream `launch` wait for the CAI producer stream of every array in `arrays`
    (inputs and preallocated outputs alike: an output may still be written by its producer).
    Every entry is checked before the first wait; one wait per distinct stream, none for
    arrays on the launch stream itself."""
    producers: Dict[int, int] = {}  # stream -> a data pointer on it (locates the device)
    for name, x in arrays.items():
        if x is None or type(x) in _dlpack_types:
            continue
        producer = cuda_array_interface_stream(x, name)
        if producer is None:
            if hasattr(type(x), "__dlpack__"):
                _dlpack_types.add(type(x))
        elif not _same_stream(producer, launch):
            producers.setdefault(producer, int(x.__cuda_array_interface__["data"][0]))
    for producer, pointer in producers.items():
        stream_waiter(launch, producer, pointer)


# Types whose instances the native module reads through DLPack (their type has __dlpack__), so
# their __cuda_array_interface__ stream is never consulted: skipped without a look.
_dlpack_types: set = set()


class _CudaDriver:
    """cuEventRecord on the producer's stream, cuStreamWaitEvent on the consumer's, through the
    CUDA driver library (loaded by every process that runs CUDA work; no toolkit needed).

    The event is created in the producer stream's context; where no context is current on this
    thread yet, the primary context of the data's device is made current (as the CUDA runtime
    would on its first call)."""

    _CU_EVENT_DISABLE_TIMING = 0x2
    _CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9

    def __init__(self):
        import ctypes  # noqa: PLC0415

        self.ctypes = ctypes
        self.lib = ctypes.CDLL("nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1")

    def _call(self, function: str, *args) -> None:
        result = getattr(self.lib, function)(*args)
        if result != 0:
            from ._C import Error  # noqa: PLC0415

            raise Error(f"__cuda_array_interface__ stream synchronisation: {function} failed "
                        f"(CUresult {result})")

    def _ensure_context(self, pointer: int) -> None:
        c = self.ctypes
        self._call("cuInit", c.c_uint(0))
        current = c.c_void_p()
        self._call("cuCtxGetCurrent", c.byref(current))
        if current.value:
            return
        ordinal = c.c_int(0)
        if pointer:
            self._call("cuPointerGetAttribute", c.byref(ordinal),
                       c.c_int(self._CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL), c.c_void_p(pointer))
        device, context = c.c_int(), c.c_void_p()
        self._call("cuDeviceGet", c.byref(device), ordinal)
        self._call("cuDevicePrimaryCtxRetain", c.byref(context), device)
        self._call("cuCtxSetCurrent", context)

    def __call__(self, consumer: int, producer: int, pointer: int) -> None:
        c = self.ctypes
        self._ensure_context(pointer)
        context, event = c.c_void_p(), c.c_void_p()
        self._call("cuStreamGetCtx", c.c_void_p(producer), c.byref(context))
        # The event and its record belong to the producer's context (the special handles 1 and
        # 2 name the current context's default streams); the wait is issued back in this
        # thread's context, where the launch stream's special handles (0, 1, 2) resolve.
        self._call("cuCtxPushCurrent_v2", context)
        try:
            self._call("cuEventCreate", c.byref(event), c.c_uint(self._CU_EVENT_DISABLE_TIMING))
            try:
                self._call("cuEventRecord", event, c.c_void_p(producer))
            except BaseException:
                self._call("cuEventDestroy_v2", event)
                raise
        finally:
            self._call("cuCtxPopCurrent_v2", c.byref(c.c_void_p()))
        try:
            self._call("cuStreamWaitEvent", c.c_void_p(consumer), event, c.c_uint(0))
        finally:
            self._call("cuEventDestroy_v2", event)  # its resources go once the event completes


_driver: Optional[_CudaDriver] = None


def _driver_wait(consumer: int, producer: int, pointer: int) -> None:
    global _driver
    if _driver is None:
        try:
            _driver = _CudaDriver()
        except OSError as error:
            from ._C import Error  # noqa: PLC0415

            raise Error("__cuda_array_interface__ names a stream to wait for, but the CUDA "
                        f"driver library cannot be loaded: {error}") from None
    _driver(consumer, producer, pointer)


# (launch stream, producer stream, data pointer) -> None; tests replace it.
stream_waiter: Callable[[int, int, int], None] = _driver_wait
