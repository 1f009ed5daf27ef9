"""The one path to the native module flashcpp._C, shared by the framework-neutral API (_api)
and the PyTorch custom ops (torch): options, workspace, launch, and the RunInfo it returns.

It knows no framework: its callers pick the device, the stream and how to allocate the
workspace, so this module imports nothing but the extension module and the standard library.
"""

from __future__ import annotations

import operator
import threading
from typing import Any, Callable, NamedTuple, Optional, Tuple

from . import _C

Error = _C.Error


class RunInfo(NamedTuple):
    """What the last call ran: backend ("cpu", "cuda_sm90", ...), kernel name, KV splits."""

    backend: str
    kernel: str
    num_splits: int


_last = threading.local()


def last_run_info() -> Optional[RunInfo]:
    """The RunInfo of the last flashcpp call made by this thread (None before any call).

    Under CUDA graph replay nothing runs on the host, so this keeps the value of the capture.
    """
    return getattr(_last, "info", None)


def _record(info: Tuple[str, str, int]) -> RunInfo:
    run = RunInfo(*info)
    _last.info = run
    return run


def cuda_available() -> bool:
    """True when flashcpp was built with CUDA and a usable GPU is present."""
    return bool(_C.cuda_available())


def options(
    causal: bool = False,
    softmax_scale: Optional[float] = None,
    window: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    backend: str = "auto",
    num_splits: int = 0,
    deterministic: bool = False,
) -> dict:
    """Checks the Python types of the options and returns the native module's keywords."""
    try:
        window_left, window_right = window
    except (TypeError, ValueError):
        raise TypeError(f"window: expected a pair (left, right) of ints, got {window!r}") from None
    if not isinstance(backend, str):
        raise TypeError(f"backend: expected a str, got {type(backend).__name__}")
    return dict(
        causal=bool(causal),
        softmax_scale=None if softmax_scale is None else float(softmax_scale),
        window_left=int32(window_left, "window", window),
        window_right=int32(window_right, "window", window),
        softcap=float(softcap),
        backend=backend,
        num_splits=int32(num_splits, "num_splits"),
        deterministic=bool(deterministic),
    )


_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def int32(value: Any, name: str, shown: Any = None) -> int:
    """`value` as an int the native module takes (C int), or an error naming the argument:
    TypeError for a non-integer (1.5 is not truncated), flashcpp.Error outside int32."""
    shown = value if shown is None else shown
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an int, got {shown!r}") from None
    if not _INT32_MIN <= number <= _INT32_MAX:
        raise Error(f"{name}: {shown!r} is outside the int32 range of the C++ API")
    return number


def select_backend(q: Any, options: dict) -> str:
    """The backend a forward call with q and these options would run on."""
    return _C.select_backend(q, **options)


# (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) of a padded (not varlen) call.
PADDED = (None, None, 0, 0)

# The launches below take, after their tensors:
#   varlen: (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k), PADDED when not varlen;
#   options: options()'s keywords; stream: the cudaStream_t to run on (0 on the host);
#   allocate: nbytes -> a writable buffer on the call's device, made by the caller's framework,
#     for the scratch memory the call asks for; None on the host, which needs none.
# The caller makes the call's device current. Each records its RunInfo for last_run_info().


# (q_descale, k_descale, v_descale): fp8_e4m3 inputs' factors, each None (1) or float32 [B, Hkv]
# or [1] on the inputs' device.
NO_DESCALES = (None, None, None)


def _descale_kwargs(descales: Tuple) -> dict:
    q_descale, k_descale, v_descale = descales
    return dict(q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)


def forward(q, k, v, out, lse, varlen: Tuple, options: dict, stream: int,
            allocate: Optional[Callable[[int], Any]], descales: Tuple = NO_DESCALES) -> RunInfo:
    """Writes out (and lse unless None)."""
    return _launch(True, (q, k, v, out, lse), q, k, v, varlen, options, stream, allocate,
                   _descale_kwargs(descales))


def backward(dout, q, k, v, out, lse, dq, dk, dv, varlen: Tuple, options: dict, stream: int,
             allocate: Optional[Callable[[int], Any]]) -> RunInfo:
    """Writes dq, dk and dv."""
    return _launch(False, (dout, q, k, v, out, lse, dq, dk, dv), q, k, v, varlen, options,
                   stream, allocate)


def _launch(is_forward, tensors, q, k, v, varlen, options, stream, allocate,
            descales: Optional[dict] = None) -> RunInfo:
    cu_q, cu_k, max_q, max_k = varlen
    shape = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=int32(max_q, "max_seqlen_q"),
                 max_seqlen_k=int32(max_k, "max_seqlen_k"))
    workspace = None
    if allocate is not None:
        query = _C.forward_workspace_size if is_forward else _C.backward_workspace_size
        nbytes = query(q, k, v, **shape, **options)
        if nbytes:
            workspace = allocate(nbytes)
    native = _C.forward if is_forward else _C.backward
    return _record(native(*tensors, **shape, **options, **(descales or {}), stream=stream,
                          workspace=workspace))


def cache_capacity(k_cache_shape: Tuple[Any, ...],
                   block_table_shape: Optional[Tuple[Any, ...]]) -> Any:
    """Keys a sequence can hold: Nmax, or max_pages * page_size for a paged cache; what
    cache_seqlens=None means, as in FlashAttention. 0 for a cache of the wrong rank (the call's
    validation names it)."""
    if len(k_cache_shape) != 4:
        return 0
    pages = block_table_shape[-1] if block_table_shape else 1
    return pages * k_cache_shape[1]


def attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, out, lse, block_table, k_new,
                           v_new, options: dict, stream: int,
                           allocate: Optional[Callable[[int], Any]],
                           descales: Tuple = NO_DESCALES) -> RunInfo:
    """Appends k_new and v_new into the caches (when given), writes out (and lse unless None).

    The workspace is sized by the call's plan, which depends on the shapes and options only, so
    a CUDA graph can replay the call with new lengths and block-table contents."""
    tensors = dict(q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=cache_seqlens, out=out,
                   block_table=block_table, k_new=k_new, v_new=v_new, lse=lse,
                   **_descale_kwargs(descales))
    workspace = None
    if allocate is not None:
        nbytes = _C.plan_kvcache(**tensors, **options)[3]
        if nbytes:
            workspace = allocate(nbytes)
    return _record(_C.attention_with_kvcache(**tensors, **options, stream=stream,
                                             workspace=workspace))
