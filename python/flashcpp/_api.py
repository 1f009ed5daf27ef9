"""Framework-neutral entry points: NumPy, PyTorch, CuPy, anything with DLPack.

Layouts follow docs/semantics.md:
q [B, Nq, Hq, D], k [B, Nk, Hkv, D], v [B, Nk, Hkv, Dv], out [B, Nq, Hq, Dv],
lse [B, Hq, Nq] float32; varlen: q [total_q, Hq, D], cu_seqlens int32 [B + 1], lse [Hq, total_q].
Any strides work as long as the last dimension is contiguous.
"""

from __future__ import annotations

import numbers
from typing import Any, Optional, Tuple

from . import _native
from ._frameworks import framework_of, order_after_producers, shape_of, stream_handle


def _autograd_ops(q, k, v, out, lse_out, stream, num_splits):
    """flashcpp.torch where q's framework hands the call to its custom ops (PyTorch tensors
    that need autograd, or under torch.compile), flashcpp.jax for JAX tracers, else None."""
    ops = framework_of(q).autograd_ops(q, k, v)
    if ops is not None and (out is not None or lse_out is not None or stream is not None
                            or num_splits):
        raise ValueError("out=, lse_out=, stream= and num_splits= are not supported with "
                         "autograd, torch.compile or JAX tracing (they go through "
                         "flashcpp.torch's custom ops or flashcpp.jax's XLA calls)")
    return ops


def _workspace_allocator(fw, like, stream):
    """Allocates a CUDA call's scratch memory with the caller's framework (None on the host).

    stream: the stream the call runs on when the caller named one (else None): the workspace is
    allocated on it, so the framework's caching allocator does not hand the memory to other
    work while the kernel may still be reading it.
    """
    if not fw.is_cuda(like):
        return None

    def allocate(nbytes):
        with fw.stream_scope(like, stream):
            return fw.empty(like, (nbytes,), "uint8")

    return allocate


def _is_fp8(x) -> bool:
    """An array of float8 e4m3fn (torch.float8_e4m3fn, ml_dtypes.float8_e4m3fn)."""
    return str(getattr(x, "dtype", "")).endswith("float8_e4m3fn")


def _check_fp8_arguments_eager(ops, descales, fp8_fast_accum=False, varlen=False):
    # flashcpp.torch carries them (its fp8 op, padded calls only); JAX tracing does not.
    if ops is None or not (fp8_fast_accum or any(d is not None for d in descales)):
        return
    if getattr(ops, "__name__", "") != "flashcpp.torch":
        raise ValueError("q_descale, k_descale, v_descale and fp8_fast_accum are not supported "
                         "with JAX tracing (fp8 inputs are for eager inference calls)")
    if varlen:
        raise ValueError("q_descale, k_descale, v_descale and fp8_fast_accum are not supported "
                         "for varlen calls through flashcpp.torch's custom ops (torch.compile, "
                         "autograd): call attention_varlen eagerly")


def _forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, return_lse,
             stream, out, lse_out, kwargs, descales=_native.NO_DESCALES, fp8_fast_accum=False):
    fw = framework_of(q)
    q_shape, v_shape = shape_of(q, "q"), shape_of(v, "v")
    shape_of(k, "k")
    varlen = cu_seqlens_q is not None
    _check_not_scalar(q_shape, "q")
    _check_not_scalar(v_shape, "v")
    # Varlen rows past cu_seqlens_q[B] belong to no sequence; CUDA kernels do not write them,
    # so outputs allocated here start as out 0 and lse -inf (docs/semantics.md).
    if out is None:
        shape = q_shape[:-1] + v_shape[-1:]
        if _is_fp8(q):  # fp8 inputs give bf16 out (pass out= for fp16)
            out = fw.empty(q, shape, "bfloat16")
            if varlen:
                out[...] = 0
        else:
            out = fw.zeros(q, shape) if varlen else fw.empty(q, shape)
    if return_lse and lse_out is None:
        if varlen and len(q_shape) == 3:
            lse_out = fw.full(q, (q_shape[1], q_shape[0]), float("-inf"), "float32")
        elif not varlen and len(q_shape) == 4:
            lse_out = fw.empty(q, (q_shape[0], q_shape[2], q_shape[1]), "float32")
    q, k, v = fw.prepare(q), fw.prepare(k), fw.prepare(v)
    with fw.device_guard(q):
        handle = fw.default_stream(q) if stream is None else stream_handle(stream)
        order_after_producers(dict(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q,
                                   cu_seqlens_k=cu_seqlens_k, out=out, lse_out=lse_out), handle)
        _native.forward(q, k, v, out, lse_out,
                        (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k), kwargs,
                        handle, _workspace_allocator(fw, q, None if stream is None else handle),
                        fw.export, descales, bool(fp8_fast_accum))
    return (out, lse_out) if return_lse else out


def attention(q, k, v, *, causal: bool = False, softmax_scale: Optional[float] = None,
              window: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
              return_lse: bool = False, backend: str = "auto", num_splits: int = 0,
              stream: Any = None, out: Any = None, lse_out: Any = None,
              q_descale: Any = None, k_descale: Any = None, v_descale: Any = None,
              fp8_fast_accum: bool = False):
    """Exact attention, out [B, Nq, Hq, Dv] = softmax(scale * q k^T) v, in q's framework.

    q [B, Nq, Hq, D], k [B, Nk, Hkv, D], v [B, Nk, Hkv, Dv] (Hq a multiple of Hkv: GQA/MQA).
    causal: bottom-right aligned (key j visible to query i iff j <= i + Nk - Nq).
    window: (left, right) around that diagonal, -1 unbounded. softcap: c * tanh(s / c), 0 off.
    return_lse: also return lse [B, Hq, Nq] float32 (natural log of the softmax denominator).
    backend: "auto", "cpu", "cpu_reference" (float64 oracle), "cuda_sm80", "cuda_sm90".
    stream: CUDA stream (int, torch or cupy stream); default: the framework's current stream
    (torch, cupy) or the legacy default stream. out/lse_out: preallocated outputs.
    PyTorch tensors that require grad, or under torch.compile, go through flashcpp.torch's
    custom ops (autograd, no graph break).
    fp8: q, k, v in float8_e4m3fn (all three) give out in bfloat16 (or out='s dtype, fp16);
    q_descale/k_descale/v_descale are float32 [B, Hkv] or [1] tensors on q's device (FA3's
    names), the factors the inputs are multiplied by. Inference only; on the CPU the float64
    reference runs it (docs/semantics.md, "FP8"). fp8_fast_accum=True lets the CUDA FP8
    forward carry O in the tensor cores' accumulator along the row, as FlashAttention-3 and
    cuDNN do: faster, but it loses small terms on long rows (docs/semantics.md, "FP8").
    """
    kwargs = _native.options(causal, softmax_scale, window, softcap, backend, num_splits)
    descales = (q_descale, k_descale, v_descale)
    ops = _autograd_ops(q, k, v, out, lse_out, stream, num_splits)
    _check_fp8_arguments_eager(ops, descales, fp8_fast_accum)
    if ops is not None:
        fp8 = {} if all(d is None for d in descales) else dict(
            q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
        if fp8_fast_accum:
            fp8["fp8_fast_accum"] = True
        return ops.attention(q, k, v, causal=causal, softmax_scale=softmax_scale, window=window,
                             softcap=softcap, return_lse=return_lse, backend=backend, **fp8)
    return _forward(q, k, v, None, None, 0, 0, return_lse, stream, out, lse_out, kwargs,
                    descales, fp8_fast_accum)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int,
                     *, causal: bool = False, softmax_scale: Optional[float] = None,
                     window: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                     return_lse: bool = False, backend: str = "auto", num_splits: int = 0,
                     stream: Any = None, out: Any = None, lse_out: Any = None,
                     q_descale: Any = None, k_descale: Any = None, v_descale: Any = None,
                     fp8_fast_accum: bool = False):
    """Attention over packed sequences: q [total_q, Hq, D], k/v [total_k, Hkv, D|Dv].

    Sequence b owns rows cu_seqlens_q[b]:cu_seqlens_q[b+1] of q (int32 [B + 1], same device as
    q) and the matching rows of k and v; max_seqlen_* bound the lengths. lse is [Hq, total_q].
    Masks are per sequence, bottom-right aligned. Other arguments as in attention().
    """
    kwargs = _native.options(causal, softmax_scale, window, softcap, backend, num_splits)
    descales = (q_descale, k_descale, v_descale)
    ops = _autograd_ops(q, k, v, out, lse_out, stream, num_splits)
    _check_fp8_arguments_eager(ops, descales, fp8_fast_accum, varlen=True)
    if ops is not None:
        return ops.attention_varlen(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
            softmax_scale=softmax_scale, window=window, softcap=softcap, return_lse=return_lse,
            backend=backend)
    if cu_seqlens_q is None or cu_seqlens_k is None:
        raise TypeError("cu_seqlens_q and cu_seqlens_k: expected int32 arrays, got None")
    return _forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, return_lse,
                    stream, out, lse_out, kwargs, descales, fp8_fast_accum)


def _check_not_scalar(shape, name):
    if not shape:
        raise _native.Error(f"{name}: expected an array with dimensions (4: [B, N, H, D]; 3 for "
                            "varlen), got a 0-dimensional one")


def _backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
              stream, dq, dk, dv, kwargs):
    fw = framework_of(q)
    shapes = [shape_of(t, n) for t, n in ((dout, "dout"), (q, "q"), (k, "k"), (v, "v"),
                                          (out, "out"), (lse, "lse"))]
    # Varlen rows past cu_seqlens[B] are not written by CUDA kernels: they start at zero.
    allocate = fw.empty if cu_seqlens_q is None else fw.zeros
    dq = allocate(q, shapes[1]) if dq is None else dq
    dk = allocate(q, shapes[2]) if dk is None else dk
    dv = allocate(q, shapes[3]) if dv is None else dv
    dout, q, k, v, out, lse = (fw.prepare(t) for t in (dout, q, k, v, out, lse))
    with fw.device_guard(q):
        handle = fw.default_stream(q) if stream is None else stream_handle(stream)
        order_after_producers(dict(dout=dout, q=q, k=k, v=v, out=out, lse=lse,
                                   cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, dq=dq,
                                   dk=dk, dv=dv), handle)
        _native.backward(dout, q, k, v, out, lse, dq, dk, dv,
                         (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k), kwargs,
                         handle, _workspace_allocator(fw, q, None if stream is None else handle),
                         fw.export)
    return dq, dk, dv


def attention_backward(dout, q, k, v, out, lse, *, causal: bool = False,
                       softmax_scale: Optional[float] = None, window: Tuple[int, int] = (-1, -1),
                       softcap: float = 0.0, deterministic: bool = False, backend: str = "auto",
                       stream: Any = None, dq: Any = None, dk: Any = None, dv: Any = None):
    """Gradients (dq, dk, dv) of attention() given its out, lse and the output gradient dout.

    The options must be those of the forward call. dk and dv of a KV head sum over the query
    heads that share it. deterministic: bitwise-identical results run to run.
    """
    kwargs = _native.options(causal, softmax_scale, window, softcap, backend, 0, deterministic)
    return _backward(dout, q, k, v, out, lse, None, None, 0, 0, stream, dq, dk, dv, kwargs)


def attention_varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                              max_seqlen_q: int, max_seqlen_k: int, *, causal: bool = False,
                              softmax_scale: Optional[float] = None,
                              window: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                              deterministic: bool = False, backend: str = "auto",
                              stream: Any = None, dq: Any = None, dk: Any = None,
                              dv: Any = None):
    """Gradients (dq, dk, dv) of attention_varlen(); lse is [Hq, total_q]."""
    if cu_seqlens_q is None or cu_seqlens_k is None:
        raise TypeError("cu_seqlens_q and cu_seqlens_k: expected int32 arrays, got None")
    kwargs = _native.options(causal, softmax_scale, window, softcap, backend, 0, deterministic)
    return _backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                     max_seqlen_k, stream, dq, dk, dv, kwargs)


def attention_with_kvcache(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens=None,
                           block_table=None, softmax_scale: Optional[float] = None,
                           causal: bool = False, window_size: Tuple[int, int] = (-1, -1),
                           softcap: float = 0.0, return_softmax_lse: bool = False,
                           num_splits: int = 0, backend: str = "auto", out: Any = None,
                           stream: Any = None, q_descale: Any = None, k_descale: Any = None,
                           v_descale: Any = None):
    """Attention of new tokens against a KV cache (decode, speculative verification, chunked
    prefill), with the arguments of FlashAttention's flash_attn_with_kvcache.

    q [B, Nnew, Hq, D]; k_cache/v_cache [B, Nmax, Hkv, D|Dv], or paged [num_pages, page_size,
    Hkv, D|Dv] with block_table int32 [B, max_pages] (page p of sequence b holds its keys
    p * page_size ...). cache_seqlens: int32 [B] on q's device, the keys each sequence holds;
    an int is broadcast, None means the whole capacity (Nmax, or max_pages * page_size).
    k/v [B, Nnew, Hkv, D|Dv] (both or neither) are written into the caches, in place, at rows
    cache_seqlens[b] ... before attending (errors name them k_new and v_new); cache_seqlens
    itself is not advanced. Sequence b attends over its cache_seqlens[b] (+ Nnew) keys; causal
    is bottom-right aligned (new token i sees the cache and the new tokens up to i), window_size
    (left, right) around that diagonal. Returns out [B, Nnew, Hq, Dv] (and lse [B, Hq, Nnew]
    float32 when return_softmax_lse).
    Everything after v is keyword-only: FlashAttention's next positional argument is
    rotary_cos. Not offered: rotary embedding, ALiBi, cache_batch_idx, cache_leftpad.
    num_splits, backend, out and stream as in attention(). Inference only: no autograd.
    fp8 cache: k_cache/v_cache in float8_e4m3fn with q (and k, v) in bfloat16 on the GPU;
    k_descale/v_descale (float32 [B, Hkv] or [1], FA3's names) dequantise the caches, and the
    appended k, v are stored as e4m3(x / descale) (docs/semantics.md, "FP8").
    """
    kwargs = _native.options(causal, softmax_scale, window_size, softcap, backend, num_splits)
    if (k is None) != (v is None):
        raise _native.Error("k and v (the new keys and values to append) must be given together")
    descales = (q_descale, k_descale, v_descale)
    fw = framework_of(q)
    ops = fw.autograd_ops(q, k_cache, v_cache)
    if ops is not None and q_descale is not None:
        raise _native.Error("q_descale: given, but q is not fp8_e4m3 (the KV cache takes 16-bit "
                            "queries)")
    if ops is not None:
        if out is not None or stream is not None:
            raise ValueError("out= and stream= are not supported under torch.compile or with "
                             "tensors that require grad (they go through flashcpp.torch's "
                             "custom ops)")
        return ops.attention_with_kvcache(
            q, k_cache, v_cache, k, v, cache_seqlens=cache_seqlens, block_table=block_table,
            softmax_scale=softmax_scale, causal=causal, window_size=window_size,
            softcap=softcap, return_softmax_lse=return_softmax_lse, num_splits=num_splits,
            backend=backend, k_descale=k_descale, v_descale=v_descale)
    q_shape, cache_shape = shape_of(q, "q"), shape_of(k_cache, "k_cache")
    v_shape = shape_of(v_cache, "v_cache")
    if cache_seqlens is None or isinstance(cache_seqlens, numbers.Integral):
        length = int(cache_seqlens) if cache_seqlens is not None else _native.cache_capacity(
            cache_shape, None if block_table is None else shape_of(block_table, "block_table"))
        cache_seqlens = fw.full(q, q_shape[:1], length, "int32")
    if out is None and q_shape and v_shape:
        out = fw.empty(q, q_shape[:-1] + v_shape[-1:])
    lse = None
    if return_softmax_lse and len(q_shape) == 4:
        lse = fw.empty(q, (q_shape[0], q_shape[2], q_shape[1]), "float32")
    q, k_cache, v_cache, k, v = (None if t is None else fw.prepare(t)
                                 for t in (q, k_cache, v_cache, k, v))
    with fw.device_guard(q):
        handle = fw.default_stream(q) if stream is None else stream_handle(stream)
        order_after_producers(dict(q=q, k_cache=k_cache, v_cache=v_cache,
                                   cache_seqlens=cache_seqlens, block_table=block_table, k=k,
                                   v=v, out=out), handle)
        _native.attention_with_kvcache(
            q, k_cache, v_cache, cache_seqlens, out, lse, block_table, k, v, kwargs, handle,
            _workspace_allocator(fw, q, None if stream is None else handle), fw.export, descales)
    return (out, lse) if return_softmax_lse else out


def select_backend(q, *, causal: bool = False, window: Tuple[int, int] = (-1, -1),
                   softcap: float = 0.0, backend: str = "auto") -> str:
    """The backend a forward call with q and these options would run on (no work is done)."""
    kwargs = _native.options(causal, None, window, softcap, backend)
    fw = framework_of(q)
    return _native.select_backend(fw.prepare(q), kwargs)
