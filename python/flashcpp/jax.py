"""JAX: flashcpp attention under jax.jit, jax.grad and jax.vmap, through the XLA FFI.

    import jax, flashcpp.jax
    loss = lambda q, k, v: flashcpp.jax.attention(q, k, v, causal=True).sum()
    dq, dk, dv = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)

attention() is a jax.custom_vjp. Its forward is one XLA custom call (the handlers of
python/src/xla_ffi.cpp, registered for XLA's CPU platform and, in a CUDA build, its CUDA
platform, where it runs on XLA's stream) and saves q, k, v, out and lse; its backward is a
second custom call. Scratch memory is an extra output of each call, so XLA allocates it with
its other buffers. flashcpp.attention() hands JAX tracers (under jit, grad, vmap) to this
module.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from . import _C, _native

try:
    from jax import ffi as _ffi  # jax 0.4.38 and later
except ImportError:
    from jax.extend import ffi as _ffi

_FORWARD = "flashcpp_attention_forward"
_BACKWARD = "flashcpp_attention_backward"
_VARLEN_FORWARD = "flashcpp_attention_varlen_forward"
_VARLEN_BACKWARD = "flashcpp_attention_varlen_backward"
_DTYPES = ("float32", "float16", "bfloat16")
_BACKENDS = ("auto", "automatic", "cpu", "cpu_reference", "cuda_sm80", "cuda_sm90")


def _running_api_version() -> Optional[Tuple[int, int]]:
    """The XLA FFI API version of the running jaxlib, read from the C API header it ships with
    itself (None where it ships none)."""
    try:
        with open(os.path.join(_ffi.include_dir(), "xla", "ffi", "api", "c_api.h")) as header:
            text = header.read()
    except (OSError, AttributeError):
        return None
    found = [re.search(rf"#define XLA_FFI_API_{part}\s+(\d+)", text)
             for part in ("MAJOR", "MINOR")]
    if not all(found):
        return None
    return int(found[0].group(1)), int(found[1].group(1))


def version_problem(built: Tuple[int, int], running: Optional[Tuple[int, int]]) -> Optional[str]:
    """Why XLA would refuse handlers built against FFI API `built`, or None: it takes those of
    its own major version and an older or equal minor one."""
    if running is None or (built[0] == running[0] and built[1] <= running[1]):
        return None
    return (f"flashcpp.jax: flashcpp's XLA FFI handlers were built against XLA FFI API "
            f"{built[0]}.{built[1]}, newer than this jaxlib's ({jax.__version__}: "
            f"{running[0]}.{running[1]}), which would refuse them; rebuild flashcpp against "
            "this jaxlib's headers (pip install --no-build-isolation . here) or upgrade jax")


_VERSION_PROBLEM = (version_problem(tuple(_C.xla_ffi_api_version), _running_api_version())
                    if getattr(_C, "has_xla_ffi", False) else None)


def available() -> bool:
    """True when this build of flashcpp has XLA FFI handlers (compiled against jaxlib's
    headers) that the running jaxlib accepts."""
    return bool(getattr(_C, "has_xla_ffi", False)) and _VERSION_PROBLEM is None


def _require_handlers() -> None:
    if _VERSION_PROBLEM is not None:
        raise RuntimeError(_VERSION_PROBLEM)
    if not available():
        raise RuntimeError(
            "flashcpp.jax: this build of flashcpp has no XLA FFI handlers, which JAX needs under "
            "jax.jit, jax.grad and jax.vmap (CMake found no usable jaxlib headers when it was "
            "built). Rebuild with them: `FLASHCPP_XLA_FFI=ON pip install .` (a pinned jaxlib "
            "as a build requirement), `pip install --no-build-isolation .` in an environment "
            "that has jax, or -C cmake.define.FLASHCPP_XLA_FFI_INCLUDE_DIR="
            "$(python -c 'import jax; print(jax.ffi.include_dir())'). Outside jit, "
            "flashcpp.attention() still takes concrete JAX arrays through DLPack.")


if available():
    for _name, _platforms in _C.xla_ffi_targets().items():
        for _platform, _handler in _platforms.items():
            _ffi.register_ffi_target(_name, _handler, platform=_platform)


@functools.lru_cache(maxsize=None)
def _cuda_device() -> Optional[int]:
    """flashcpp's CUDA device for trace-time workspace queries, or None where JAX's calls
    cannot run on CUDA (a CPU build of flashcpp, no GPU, a JAX without a CUDA backend)."""
    if not _C.built_with_cuda or not _native.cuda_available():
        return None
    for platform in ("cuda", "gpu"):
        try:
            if jax.devices(platform):
                return 0
        except RuntimeError:
            continue
    return None


def _workspace_bytes(for_backward: bool, q, k, v, options: dict, varlen: Tuple = ()) -> int:
    """Scratch bytes of the call if it runs on CUDA; 0 where it cannot (the CPU needs none).

    Traced shapes carry no platform, so a CUDA-capable process sizes every call for CUDA (an
    unused buffer on the CPU). The size is asked for device 0: it depends on the device only
    through the forward's KV-split heuristic, and a forward whose workspace is too small for
    the split it wants runs unsplit (same result); the backward's size is the same on every
    device. varlen: (batch, max_seqlen_q, max_seqlen_k) of a varlen call."""
    device = _cuda_device()
    if device is None or options["backend"] in ("cpu", "cpu_reference"):
        return 0
    try:
        return int(_C.xla_workspace_size(for_backward, q.dtype.name, q.shape, k.shape, v.shape,
                                          device, *varlen, **options))
    except _native.Error:
        return 0  # the call itself reports what is wrong with it, where it runs


def _ffi_attributes(options: dict) -> dict:
    """The options as XLA FFI attributes (xla_ffi.cpp: AttentionAttrs); an attribute cannot be
    None, so softmax_scale comes with has_softmax_scale."""
    scale = options["softmax_scale"]
    return dict(
        causal=np.bool_(options["causal"]),
        has_softmax_scale=np.bool_(scale is not None),
        softmax_scale=np.float32(0.0 if scale is None else scale),
        window_left=np.int32(options["window_left"]),
        window_right=np.int32(options["window_right"]),
        softcap=np.float32(options["softcap"]),
        backend=options["backend"],
        num_splits=np.int32(options["num_splits"]),
        deterministic=np.bool_(options["deterministic"]),
    )


# ---- jax.shard_map ----------------------------------------------------------------------------
# Inside shard_map an array's type names the mesh axes it varies over (jax >= 0.7: `vma`, later
# `manual_axis_type`). An FFI call needs all its inputs to agree, and its results vary over
# nothing of their own: _apply makes inputs and results vary over the axes any input does.
def _varying_axes(x) -> frozenset:
    typeof = getattr(jax, "typeof", None)
    aval = typeof(x) if typeof is not None else None
    manual = getattr(aval, "manual_axis_type", None)
    if manual is not None:
        return frozenset(manual.varying)
    return frozenset(getattr(aval, "vma", None) or ())


def _vary(x, axes: frozenset):
    missing = tuple(sorted(axes - _varying_axes(x)))
    if not missing:
        return x
    pcast = getattr(jax.lax, "pcast", None)
    if pcast is not None:
        return pcast(x, missing, to="varying")
    return jax.lax.pvary(x, missing)  # jax 0.7 to 0.9


def _same_varying_axes(*arrays):
    """The arrays, each varying over the axes any of them does: before the custom_vjp, so that
    JAX sums the gradient of an input that did not vary (the transpose of pcast)."""
    axes = frozenset().union(*(_varying_axes(a) for a in arrays))
    return tuple(_vary(a, axes) for a in arrays)


def _apply(call, *args, **attributes):
    axes = frozenset().union(*(_varying_axes(a) for a in args))
    results = call(*(_vary(a, axes) for a in args), **attributes)
    return [_vary(r, axes) for r in results]


def _workspace(nbytes: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((nbytes,), jnp.uint8)


# vmap: "broadcast_all" gives the handlers every buffer with the mapped dimensions in front;
# they fold them into the batch dimension (one call for the whole vmapped batch).
def _forward_call(q, k, v, options: dict):
    batch, rows, heads, _ = q.shape
    results = (
        jax.ShapeDtypeStruct(q.shape[:-1] + v.shape[-1:], q.dtype),      # out
        jax.ShapeDtypeStruct((batch, heads, rows), jnp.float32),         # lse
        _workspace(_workspace_bytes(False, q, k, v, options)),
    )
    call = _ffi.ffi_call(_FORWARD, results, vmap_method="broadcast_all")
    out, lse, _ = _apply(call, q, k, v, **_ffi_attributes(options))
    return out, lse


def _backward_call(dout, q, k, v, out, lse, options: dict):
    results = (
        jax.ShapeDtypeStruct(q.shape, q.dtype),
        jax.ShapeDtypeStruct(k.shape, k.dtype),
        jax.ShapeDtypeStruct(v.shape, v.dtype),
        _workspace(_workspace_bytes(True, q, k, v, options)),
    )
    call = _ffi.ffi_call(_BACKWARD, results, vmap_method="broadcast_all")
    dq, dk, dv, _ = _apply(call, dout, q, k, v, out, lse, **_ffi_attributes(options))
    return dq, dk, dv


# options: the items of _native.options(), a tuple so that JAX can hash it.
@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _attention(q, k, v, options: Tuple) -> Tuple[Any, Any]:
    return _forward_call(q, k, v, dict(options))


def _attention_fwd(q, k, v, options):
    out, lse = _forward_call(q, k, v, dict(options))
    return (out, lse), (q, k, v, out, lse)


def _attention_bwd(options, residuals, cotangents):
    q, k, v, out, lse = residuals
    dout, _ = cotangents  # attention() returns lse through stop_gradient: its cotangent is 0
    return _backward_call(dout.astype(q.dtype), q, k, v, out, lse, dict(options))


_attention.defvjp(_attention_fwd, _attention_bwd)


def _check_inputs(q, k, v, rank: int = 4, layout: str = "[B, N, H, D]") -> None:
    """What the traced output shapes need; the handlers' call validates the rest (batch, heads,
    head dims, the backend's limits) and raises with flashcpp's message."""
    for x, name in ((q, "q"), (k, "k"), (v, "v")):
        if x.ndim != rank:
            raise _native.Error(f"{name}: expected {rank} dimensions {layout}, got shape "
                                f"{tuple(x.shape)}")
        if x.dtype.name not in _DTYPES:
            raise TypeError(f"{name}: dtype {x.dtype.name} is not supported (supported: "
                            f"{', '.join(_DTYPES)})")
    for x, name in ((k, "k"), (v, "v")):
        if x.dtype != q.dtype:
            raise _native.Error(f"{name}: dtype {x.dtype.name} differs from q's "
                                f"{q.dtype.name}")


def _checked_options(causal, softmax_scale, window, softcap, backend, num_splits,
                     deterministic) -> dict:
    """The native module's options, once the handlers are known to be there."""
    _require_handlers()
    options = _native.options(causal, softmax_scale, window, softcap, backend, num_splits,
                              deterministic)
    if backend not in _BACKENDS:
        raise _native.Error("backend: expected one of auto, cpu, cpu_reference, cuda_sm80, "
                            f"cuda_sm90, got {backend!r}")
    return options


def attention(q, k, v, *, causal: bool = False, softmax_scale: Optional[float] = None,
              window: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
              return_lse: bool = False, backend: str = "auto", num_splits: int = 0,
              deterministic: bool = False):
    """flashcpp.attention() for JAX, differentiable and traceable (jit, grad, vmap).

    q [B, Nq, Hq, D], k [B, Nk, Hkv, D], v [B, Nk, Hkv, Dv] (Hq a multiple of Hkv), float32
    (CPU), float16 or bfloat16; options as in flashcpp.attention(). Gradients flow to q, k and
    v; lse (return_lse=True) is returned through jax.lax.stop_gradient. deterministic applies
    to the backward. Under jax.vmap the mapped dimensions join the batch.
    """
    options = _checked_options(causal, softmax_scale, window, softcap, backend, num_splits,
                               deterministic)
    q, k, v = _same_varying_axes(*(jnp.asarray(x) for x in (q, k, v)))
    _check_inputs(q, k, v)
    out, lse = _attention(q, k, v, tuple(options.items()))
    if return_lse:
        return out, jax.lax.stop_gradient(lse)
    return out


# ---- varlen ----------------------------------------------------------------------------------
# The library leaves rows past cu_seqlens[B] unwritten on CUDA (docs/semantics.md: out and the
# gradients 0 there, lse -inf), so the calls take zero-filled (-inf) initial outputs aliased to
# their results. vmap runs the call once per mapped element ("sequential"): the offsets of
# different elements cannot share one batch.
def _varlen_forward_call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                         options: dict):
    total_q, heads, _ = q.shape
    shape = (int(cu_seqlens_q.shape[0]) - 1, max_seqlen_q, max_seqlen_k)
    results = (
        jax.ShapeDtypeStruct(q.shape[:-1] + v.shape[-1:], q.dtype),   # out
        jax.ShapeDtypeStruct((heads, total_q), jnp.float32),          # lse
        _workspace(_workspace_bytes(False, q, k, v, options, shape)),
    )
    call = _ffi.ffi_call(_VARLEN_FORWARD, results, vmap_method="sequential",
                         input_output_aliases={5: 0, 6: 1})
    out, lse, _ = _apply(call, q, k, v, cu_seqlens_q, cu_seqlens_k,
                         jnp.zeros(results[0].shape, q.dtype),
                         jnp.full(results[1].shape, -jnp.inf, jnp.float32),
                         **_varlen_attributes(options, max_seqlen_q, max_seqlen_k))
    return out, lse


def _varlen_attributes(options: dict, max_seqlen_q: int, max_seqlen_k: int) -> dict:
    return dict(_ffi_attributes(options), max_seqlen_q=np.int32(max_seqlen_q),
                max_seqlen_k=np.int32(max_seqlen_k))


# lengths: (max_seqlen_q, max_seqlen_k); options as in _attention.
@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, lengths: Tuple, options: Tuple):
    return _varlen_forward_call(q, k, v, cu_seqlens_q, cu_seqlens_k, *lengths, dict(options))


def _attention_varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, lengths, options):
    out, lse = _varlen_forward_call(q, k, v, cu_seqlens_q, cu_seqlens_k, *lengths,
                                    dict(options))
    return (out, lse), (q, k, v, cu_seqlens_q, cu_seqlens_k, out, lse)


def _attention_varlen_bwd(lengths, options, residuals, cotangents):
    q, k, v, cu_seqlens_q, cu_seqlens_k, out, lse = residuals
    dout, _ = cotangents  # lse leaves through stop_gradient, as in attention()
    options = dict(options)
    shape = (int(cu_seqlens_q.shape[0]) - 1,) + tuple(lengths)
    results = (
        jax.ShapeDtypeStruct(q.shape, q.dtype),
        jax.ShapeDtypeStruct(k.shape, k.dtype),
        jax.ShapeDtypeStruct(v.shape, v.dtype),
        _workspace(_workspace_bytes(True, q, k, v, options, shape)),
    )
    call = _ffi.ffi_call(_VARLEN_BACKWARD, results, vmap_method="sequential",
                         input_output_aliases={8: 0, 9: 1, 10: 2})
    dq, dk, dv, _ = _apply(call, dout.astype(q.dtype), q, k, v, out, lse, cu_seqlens_q,
                           cu_seqlens_k, jnp.zeros_like(q), jnp.zeros_like(k),
                           jnp.zeros_like(v), **_varlen_attributes(options, *lengths))
    return dq, dk, dv, None, None  # the offsets are integers: no gradient


_attention_varlen.defvjp(_attention_varlen_fwd, _attention_varlen_bwd)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int,
                     *, causal: bool = False, softmax_scale: Optional[float] = None,
                     window: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                     return_lse: bool = False, backend: str = "auto", num_splits: int = 0,
                     deterministic: bool = False):
    """flashcpp.attention_varlen() for JAX (jit, grad; vmap runs one call per element).

    q [total_q, Hq, D], k/v [total_k, Hkv, D|Dv]; cu_seqlens_q/k int32 [B + 1] (traced
    arrays are fine); max_seqlen_q/k Python ints bounding the lengths (static under jit).
    lse is [Hq, total_q]. Rows past cu_seqlens[B] get out 0 and lse -inf. Other arguments as
    in attention().
    """
    options = _checked_options(causal, softmax_scale, window, softcap, backend, num_splits,
                               deterministic)
    lengths = (_native.int32(max_seqlen_q, "max_seqlen_q"),
               _native.int32(max_seqlen_k, "max_seqlen_k"))
    q, k, v = _same_varying_axes(*(jnp.asarray(x) for x in (q, k, v)))
    _check_inputs(q, k, v, 3, "[total, H, D]")
    cu_seqlens_q, cu_seqlens_k = (jnp.asarray(c) for c in (cu_seqlens_q, cu_seqlens_k))
    for cu, name in ((cu_seqlens_q, "cu_seqlens_q"), (cu_seqlens_k, "cu_seqlens_k")):
        if cu.ndim != 1 or cu.dtype != jnp.int32:
            raise _native.Error(f"{name}: expected int32 [B + 1], got {cu.dtype.name} "
                                f"{tuple(cu.shape)}")
    if cu_seqlens_q.shape != cu_seqlens_k.shape:
        raise _native.Error(f"cu_seqlens_k: expected {tuple(cu_seqlens_q.shape)} entries (same "
                            f"as cu_seqlens_q), got {tuple(cu_seqlens_k.shape)}")
    out, lse = _attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, lengths,
                                 tuple(options.items()))
    if return_lse:
        return out, jax.lax.stop_gradient(lse)
    return out


def attention_with_kvcache(*args, **kwargs):
    """Not offered for JAX: the KV-cache call writes its caches in place."""
    raise NotImplementedError(
        "flashcpp.jax: attention_with_kvcache is not available under jax.jit / jax.grad / "
        "jax.vmap (it writes the caches in place); call flashcpp.attention_with_kvcache on "
        "concrete arrays")
