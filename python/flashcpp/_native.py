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
    """Checks the Python types of the options and returns the native module's keywords.

    The result is shared between calls with the same arguments (callers must not modify it):
    building it costs more than the rest of a small decode call's Python layer."""
    key = (causal, softmax_scale, window, softcap, backend, num_splits, deterministic)
    # Only exact ints are looked up: 1.0 == 1 would otherwise find the entry of 1 and skip
    # the TypeError that a float window or num_splits gets.
    exact = (type(window) is tuple and len(window) == 2 and type(window[0]) is int
             and type(window[1]) is int and type(num_splits) is int)
    if exact:
        try:
            cached = _options_cache.get(key)
        except TypeError:  # an unhashable argument (a list window, a tensor scale): not cached
            exact = False
        else:
            if cached is not None:
                return cached
    try:
        window_left, window_right = window
    except (TypeError, ValueError):
        raise TypeError(f"window: expected a pair (left, right) of ints, got {window!r}") from None
    if not isinstance(backend, str):
        raise TypeError(f"backend: expected a str, got {type(backend).__name__}")
    result = dict(
        causal=bool(causal),
        softmax_scale=None if softmax_scale is None else float(softmax_scale),
        window_left=int32(window_left, "window", window),
        window_right=int32(window_right, "window", window),
        softcap=float(softcap),
        backend=backend,
        num_splits=int32(num_splits, "num_splits"),
        deterministic=bool(deterministic),
    )
    if exact:
        if len(_options_cache) >= _OPTIONS_CACHE_SIZE:  # e.g. a scale that changes every call
            _options_cache.clear()
        _options_cache[key] = result
    return result


# options() results by their arguments; a handful of entries in a model's life.
_options_cache: dict = {}
_OPTIONS_CACHE_SIZE = 256


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
#     for the scratch memory the call asks for; None on the host, which needs none;
#   export: array -> what the native module is handed for it (a DLPack capsule made without the
#     Python-level __dlpack__ method, which costs a few microseconds per array and call), or
#     None to hand the arrays over as they are. Called once per array and native call, since a
#     capsule is consumed by the call that imports it.
# The caller makes the call's device current. Each records its RunInfo for last_run_info().


# (q_descale, k_descale, v_descale): fp8_e4m3 inputs' factors, each None (1) or float32 [B, Hkv]
# or [1] on the inputs' device.
NO_DESCALES = (None, None, None)


def _descale_kwargs(descales: Tuple) -> dict:
    q_descale, k_descale, v_descale = descales
    return dict(q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)


def forward(q, k, v, out, lse, varlen: Tuple, options: dict, stream: int,
            allocate: Optional[Callable[[int], Any]],
            export: Optional[Callable[[Any], Any]] = None,
            descales: Tuple = NO_DESCALES, fp8_fast_accum: bool = False) -> RunInfo:
    """Writes out (and lse unless None). fp8_fast_accum: AttentionOptions::fp8_fast_accum."""
    fp8 = _descale_kwargs(descales)
    if fp8_fast_accum:
        fp8["fp8_fast_accum"] = True
    return _launch(True, (q, k, v, out, lse), varlen, options, stream, allocate, export, fp8)


def backward(dout, q, k, v, out, lse, dq, dk, dv, varlen: Tuple, options: dict, stream: int,
             allocate: Optional[Callable[[int], Any]],
             export: Optional[Callable[[Any], Any]] = None) -> RunInfo:
    """Writes dq, dk and dv."""
    return _launch(False, (dout, q, k, v, out, lse, dq, dk, dv), varlen, options, stream,
                   allocate, export)


def _exported(arrays: Tuple, export: Optional[Callable[[Any], Any]]) -> Tuple:
    if export is None:
        return arrays
    return tuple(None if a is None else export(a) for a in arrays)


_NO_VARLEN: dict = {}  # a padded call leaves cu_seqlens and max_seqlen at their defaults


def _launch(is_forward, tensors, varlen, options, stream, allocate, export,
            descales: Optional[dict] = None) -> RunInfo:
    cu_q, cu_k, max_q, max_k = varlen
    if cu_q is None and cu_k is None and max_q == 0 and max_k == 0:
        shape = _NO_VARLEN
    else:
        shape = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                     max_seqlen_q=int32(max_q, "max_seqlen_q"),
                     max_seqlen_k=int32(max_k, "max_seqlen_k"))
    workspace = None
    if allocate is not None:
        # q, k and v: the last three of the backward's first six tensors, the first three of
        # the forward's
        qkv = tensors[:3] if is_forward else tensors[1:4]
        query = _C.forward_workspace_size if is_forward else _C.backward_workspace_size
        nbytes = query(*_exported(qkv, export), **_exported_varlen(shape, export), **options)
        if nbytes:
            workspace = allocate(nbytes)
    native = _C.forward if is_forward else _C.backward
    return _record(native(*_exported(tensors, export), **_exported_varlen(shape, export),
                          **options, **(descales or {}), stream=stream,
                          workspace=None if workspace is None or export is None
                          else export(workspace)))


def _exported_varlen(shape: dict, export: Optional[Callable[[Any], Any]]) -> dict:
    if export is None or not shape:
        return shape
    cu_q, cu_k = _exported((shape["cu_seqlens_q"], shape["cu_seqlens_k"]), export)
    return dict(shape, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)


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
                           export: Optional[Callable[[Any], Any]] = None,
                           descales: Tuple = NO_DESCALES) -> RunInfo:
    """Appends k_new and v_new into the caches (when given), writes out (and lse unless None).

    The workspace is sized by the call's plan, which depends on the shapes and options only, so
    a CUDA graph can replay the call with new lengths and block-table contents."""
    # The native module's positional order: q, k_cache, v_cache, cache_seqlens, out,
    # block_table, k_new, v_new, lse; the descales by name.
    tensors = (q, k_cache, v_cache, cache_seqlens, out, block_table, k_new, v_new, lse)
    scales = _descale_kwargs(descales)
    workspace = None
    if allocate is not None:
        nbytes = _C.plan_kvcache(*_exported(tensors, export), **scales, **options)[3]
        if nbytes:
            workspace = allocate(nbytes)
            if export is not None:
                workspace = export(workspace)
    return _record(_C.attention_with_kvcache(*_exported(tensors, export), **scales, **options,
                                             stream=stream, workspace=workspace))
