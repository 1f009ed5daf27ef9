"""PyTorch integration: flashcpp as torch.library custom ops.

    import flashcpp.torch as fa
    out = fa.attention(q, k, v, causal=True)        # [B, N, H, D], autograd-aware
    out = fa.sdpa(q, k, v, is_causal=True)          # F.scaled_dot_product_attention's [B, H, N, D]
    out = fa.attention_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lens, causal=True)

The ops (torch.ops.flashcpp.attention_fwd / attention_bwd and their varlen twins) have fake
(meta) implementations and an autograd formula, so torch.compile(fullgraph=True) traces through
them without a graph break, and they allocate only through torch.empty on the caller's current
stream: CUDA graphs capture them. Where a kernel is missing (e.g. a GPU backward not built
yet), the C++ error surfaces as flashcpp.Error (a ValueError) naming it.

Gradients flow to q, k and v; the returned lse is not differentiable. The KV-cache ops
(attention_with_kvcache) are for inference and have no gradient.
"""

import contextlib
import functools
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _native
from ._frameworks import framework_of
from ._native import Error

_FP8 = getattr(torch, "float8_e4m3fn", None)  # None on a PyTorch without float8

__all__ = ["attention", "attention_varlen", "attention_with_kvcache", "sdpa"]


# ---- helpers shared by the real and the fake implementations -------------------------------
def _last_dim_contiguous(t: Tensor) -> Tensor:
    # flashcpp takes any strides but the last; a copy is made only when that one is not 1.
    return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


def _check_rank(t: Tensor, name: str, rank: int, layout: str) -> None:
    if t.dim() != rank:
        raise Error(f"{name}: expected {rank} dimensions {layout}, got {t.dim()}")


def _forward_outputs(q: Tensor, v: Tensor, varlen: bool) -> Tuple[Tensor, Tensor]:
    # fp8 (float8_e4m3fn) q, k, v give a bfloat16 out.
    out_dtype = torch.bfloat16 if q.dtype == _FP8 else q.dtype
    if varlen:
        _check_rank(q, "q", 3, "[total_q, Hq, D]")
        _check_rank(v, "v", 3, "[total_k, Hkv, Dv]")
        total, heads = q.shape[0], q.shape[1]
        # Rows past cu_seqlens_q[B] belong to no sequence and are not written on CUDA: they
        # start as out 0 and lse -inf (docs/semantics.md).
        out = q.new_zeros((total, heads, v.shape[-1]), dtype=out_dtype)
        lse = q.new_full((heads, total), float("-inf"), dtype=torch.float32)
    else:
        _check_rank(q, "q", 4, "[B, Nq, Hq, D]")
        _check_rank(v, "v", 4, "[B, Nk, Hkv, Dv]")
        batch, rows, heads = q.shape[0], q.shape[1], q.shape[2]
        out = q.new_empty((batch, rows, heads, v.shape[-1]), dtype=out_dtype)
        lse = q.new_empty((batch, heads, rows), dtype=torch.float32)
    return out, lse


def _export(t: Optional[Tensor]) -> Optional[Tensor]:
    # DLPack refuses tensors that require grad; the ops only read them.
    return t.detach() if t is not None and t.requires_grad else t


def _device_guard(t: Tensor):
    if t.is_cuda and t.device.index != torch.cuda.current_device():
        return torch.cuda.device(t.device)
    return contextlib.nullcontext()


def _launch(run, q: Tensor, *args) -> None:
    """run(*args, stream, allocate, export), a _native launch, on q's device and its current
    stream, with a torch-owned workspace; tensors go to the native module as DLPack capsules
    made by torch's C++ (cheaper than their __dlpack__ method)."""
    if not q.is_cuda:
        run(*args, 0, None, _export_tensor)
        return
    with _device_guard(q):
        stream = torch.cuda.current_stream(q.device).cuda_stream
        allocate = functools.partial(torch.empty, dtype=torch.uint8, device=q.device)
        run(*args, stream, allocate, _export_tensor)


# torch.Tensor -> what the native module is handed (see TorchFramework.export)
_export_tensor = framework_of(torch.empty(0)).export


# ---- forward ops --------------------------------------------------------------------------
def _run_forward(q, k, v, varlen, options, descales=_native.NO_DESCALES,
                 fp8_fast_accum: bool = False) -> Tuple[Tensor, Tensor]:
    q, k, v = (_export(_last_dim_contiguous(t)) for t in (q, k, v))
    out, lse = _forward_outputs(q, v, varlen=varlen[0] is not None)  # cu_seqlens_q given
    run = _native.forward
    if fp8_fast_accum or any(d is not None for d in descales):
        run = functools.partial(_native.forward, descales=descales, fp8_fast_accum=fp8_fast_accum)
    _launch(run, q, q, k, v, out, lse, varlen, options)
    return out, lse


@torch.library.custom_op("flashcpp::attention_fwd", mutates_args=())
def _attention_fwd(q: Tensor, k: Tensor, v: Tensor, causal: bool,
                   softmax_scale: Optional[float], window_left: int, window_right: int,
                   softcap: float, backend: str, deterministic: bool) -> Tuple[Tensor, Tensor]:
    options = _native.options(causal, softmax_scale, (window_left, window_right), softcap,
                              backend)
    return _run_forward(q, k, v, _native.PADDED, options)


@_attention_fwd.register_fake
def _attention_fwd_fake(q, k, v, causal, softmax_scale, window_left, window_right, softcap,
                        backend, deterministic):
    return _forward_outputs(_last_dim_contiguous(q), v, varlen=False)


@torch.library.custom_op("flashcpp::attention_varlen_fwd", mutates_args=())
def _attention_varlen_fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                          cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
                          causal: bool, softmax_scale: Optional[float], window_left: int,
                          window_right: int, softcap: float, backend: str,
                          deterministic: bool) -> Tuple[Tensor, Tensor]:
    options = _native.options(causal, softmax_scale, (window_left, window_right), softcap,
                              backend)
    return _run_forward(q, k, v, (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k),
                        options)


@_attention_varlen_fwd.register_fake
def _attention_varlen_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               causal, softmax_scale, window_left, window_right, softcap,
                               backend, deterministic):
    return _forward_outputs(_last_dim_contiguous(q), v, varlen=True)


# FP8 (float8_e4m3fn q, k, v; bfloat16 out): inference only, so an op of its own without an
# autograd formula, which also carries the descales (float32 [B, Hkv] or [1] tensors read on
# the device: a CUDA graph may replay the call after they change).
@torch.library.custom_op("flashcpp::attention_fp8_fwd", mutates_args=())
def _attention_fp8_fwd(q: Tensor, k: Tensor, v: Tensor, causal: bool,
                       softmax_scale: Optional[float], window_left: int, window_right: int,
                       softcap: float, backend: str, q_descale: Optional[Tensor],
                       k_descale: Optional[Tensor], v_descale: Optional[Tensor],
                       fp8_fast_accum: bool = False) -> Tuple[Tensor, Tensor]:
    options = _native.options(causal, softmax_scale, (window_left, window_right), softcap,
                              backend)
    return _run_forward(q, k, v, _native.PADDED, options, (q_descale, k_descale, v_descale),
                        fp8_fast_accum)


@_attention_fp8_fwd.register_fake
def _attention_fp8_fwd_fake(q, k, v, causal, softmax_scale, window_left, window_right, softcap,
                            backend, q_descale, k_descale, v_descale, fp8_fast_accum=False):
    return _forward_outputs(_last_dim_contiguous(q), v, varlen=False)


# ---- backward ops -------------------------------------------------------------------------
def _grad_outputs(q: Tensor, k: Tensor, v: Tensor,
                  varlen: bool) -> Tuple[Tensor, Tensor, Tensor]:
    # *_like keeps the (dense) layout of each input, so gradients match their tensors. Varlen
    # rows past cu_seqlens[B] are not written on CUDA: they start at zero.
    like = torch.zeros_like if varlen else torch.empty_like
    return tuple(like(_last_dim_contiguous(t)) for t in (q, k, v))


def _run_backward(dout, q, k, v, out, lse, varlen, options) -> Tuple[Tensor, Tensor, Tensor]:
    dout, q, k, v, out = (_export(_last_dim_contiguous(t)) for t in (dout, q, k, v, out))
    dq, dk, dv = _grad_outputs(q, k, v, varlen[0] is not None)
    _launch(_native.backward, q, dout, q, k, v, out, _export(lse), dq, dk, dv, varlen, options)
    return dq, dk, dv


@torch.library.custom_op("flashcpp::attention_bwd", mutates_args=())
def _attention_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                   causal: bool, softmax_scale: Optional[float], window_left: int,
                   window_right: int, softcap: float, backend: str,
                   deterministic: bool) -> Tuple[Tensor, Tensor, Tensor]:
    options = _native.options(causal, softmax_scale, (window_left, window_right), softcap,
                              backend, 0, deterministic)
    return _run_backward(dout, q, k, v, out, lse, _native.PADDED, options)


@_attention_bwd.register_fake
def _attention_bwd_fake(dout, q, k, v, out, lse, causal, softmax_scale, window_left,
                        window_right, softcap, backend, deterministic):
    return _grad_outputs(q, k, v, varlen=False)


@torch.library.custom_op("flashcpp::attention_varlen_bwd", mutates_args=())
def _attention_varlen_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                          lse: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                          max_seqlen_q: int, max_seqlen_k: int, causal: bool,
                          softmax_scale: Optional[float], window_left: int, window_right: int,
                          softcap: float, backend: str,
                          deterministic: bool) -> Tuple[Tensor, Tensor, Tensor]:
    options = _native.options(causal, softmax_scale, (window_left, window_right), softcap,
                              backend, 0, deterministic)
    return _run_backward(dout, q, k, v, out, lse,
                         (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k), options)


@_attention_varlen_bwd.register_fake
def _attention_varlen_bwd_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                               max_seqlen_q, max_seqlen_k, causal, softmax_scale, window_left,
                               window_right, softcap, backend, deterministic):
    return _grad_outputs(q, k, v, varlen=False)


# ---- autograd -----------------------------------------------------------------------------
def _setup_context(ctx, inputs, output):
    q, k, v = inputs[:3]
    out, lse = output
    varlen = len(inputs) == 14  # varlen inputs carry cu_seqlens_q/k and max_seqlen_q/k
    ctx.save_for_backward(q, k, v, out, lse, *(inputs[3:5] if varlen else ()))
    ctx.rest = inputs[3:-1]
    ctx.deterministic = inputs[-1]
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse = ctx.saved_tensors[:5]
    if dout is None:
        dout = torch.zeros_like(out)
    # warn_only asks for a warning where no deterministic kernel exists, not for an error
    deterministic = ctx.deterministic or (
        torch.are_deterministic_algorithms_enabled()
        and not torch.is_deterministic_algorithms_warn_only_enabled())
    if len(ctx.rest) == 6:  # (causal, scale, window_left, window_right, softcap, backend)
        grads = torch.ops.flashcpp.attention_bwd(dout, q, k, v, out, lse, *ctx.rest,
                                                 deterministic)
    else:  # varlen: (cu_q, cu_k, max_q, max_k, causal, ...): cu_seqlens come from saved_tensors
        cu_q, cu_k = ctx.saved_tensors[5:7]
        grads = torch.ops.flashcpp.attention_varlen_bwd(dout, q, k, v, out, lse, cu_q, cu_k,
                                                        *ctx.rest[2:], deterministic)
    return (*grads,) + (None,) * (len(ctx.rest) + 1)


torch.library.register_autograd("flashcpp::attention_fwd", _backward,
                                setup_context=_setup_context)
torch.library.register_autograd("flashcpp::attention_varlen_fwd", _backward,
                                setup_context=_setup_context)


# ---- KV cache (inference only: no autograd formula) ----------------------------------------
# Two ops, so that only calls that append declare a mutation: torch.compile then
# functionalizes (and re-inplaces) the caches of appending calls alone, and a read-only call on
# a view of someone else's cache (transformers' DynamicCache) is a plain op.
def _kvcache_outputs(q: Tensor, v_cache: Tensor) -> Tuple[Tensor, Tensor]:
    _check_rank(q, "q", 4, "[B, Nnew, Hq, D]")
    _check_rank(v_cache, "v_cache", 4, "[B, Nmax, Hkv, Dv] or [num_pages, page_size, Hkv, Dv]")
    batch, rows, heads = q.shape[0], q.shape[1], q.shape[2]
    out = q.new_empty((batch, rows, heads, v_cache.shape[-1]))
    lse = q.new_empty((batch, heads, rows), dtype=torch.float32)
    return out, lse


def _run_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, causal, softmax_scale,
                 window_left, window_right, softcap, num_splits, backend, k_descale, v_descale):
    options = _native.options(causal, softmax_scale, (window_left, window_right), softcap,
                              backend, num_splits)
    q, k, v = (None if t is None else _export(_last_dim_contiguous(t)) for t in (q, k, v))
    # The caches are used as they are: a copy would not receive the append.
    k_cache, v_cache = _export(k_cache), _export(v_cache)
    out, lse = _kvcache_outputs(q, v_cache)
    run = functools.partial(_native.attention_with_kvcache, descales=(None, k_descale, v_descale))
    _launch(run, q, q, k_cache, v_cache, cache_seqlens, out, lse, block_table, k, v, options)
    return out, lse


@torch.library.custom_op("flashcpp::attention_with_kvcache", mutates_args=())
def _attention_with_kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_seqlens: Tensor,
                            block_table: Optional[Tensor], causal: bool,
                            softmax_scale: Optional[float], window_left: int, window_right: int,
                            softcap: float, num_splits: int, backend: str,
                            k_descale: Optional[Tensor],
                            v_descale: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    return _run_kvcache(q, k_cache, v_cache, None, None, cache_seqlens, block_table, causal,
                        softmax_scale, window_left, window_right, softcap, num_splits, backend,
                        k_descale, v_descale)


@_attention_with_kvcache.register_fake
def _attention_with_kvcache_fake(q, k_cache, v_cache, cache_seqlens, block_table, *options):
    return _kvcache_outputs(q, v_cache)


@torch.library.custom_op("flashcpp::attention_with_kvcache_append",
                         mutates_args=("k_cache", "v_cache"))
def _attention_with_kvcache_append(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Tensor,
                                   v: Tensor, cache_seqlens: Tensor,
                                   block_table: Optional[Tensor], causal: bool,
                                   softmax_scale: Optional[float], window_left: int,
                                   window_right: int, softcap: float, num_splits: int,
                                   backend: str, k_descale: Optional[Tensor],
                                   v_descale: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    return _run_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, causal,
                        softmax_scale, window_left, window_right, softcap, num_splits, backend,
                        k_descale, v_descale)


@_attention_with_kvcache_append.register_fake
def _attention_with_kvcache_append_fake(q, k_cache, v_cache, k, v, cache_seqlens, block_table,
                                        *options):
    return _kvcache_outputs(q, v_cache)


# ---- eager fast path ------------------------------------------------------------------------
# Dispatching a custom op costs tens of microseconds of host time (torch's dispatcher, the
# autograd wrapper, the aliasing check), more than a whole decode call's own Python. Where the op
# would do nothing but call its implementation (eager, plain tensors, no mode or transform that
# intercepts ops, no profiler listing op names, no gradient to record), the public functions call
# the implementation directly. Each check reads torch internals; where one is missing (another
# torch version) the fast path is off and every call goes through the op.
def _internal(path: str):
    target = torch
    for part in path.split("."):
        target = getattr(target, part, None)
        if target is None:
            return None
    return target


_compiling = _internal("compiler.is_compiling")
_function_mode = _internal("_C._is_torch_function_mode_enabled")
_dispatch_modes = _internal("_C._len_torch_dispatch_stack")
_profiling = _internal("_C._autograd._profiler_enabled")
_functorch_level = _internal("_C._functorch.maybe_current_level")
_FAST_PATH = None not in (_compiling, _function_mode, _dispatch_modes, _profiling,
                          _functorch_level)


def _direct_call_ok(*tensors) -> bool:
    """True where calling an op's implementation directly does what the op call would do.
    tensors: the op's tensor arguments (None for an absent optional one)."""
    if not _FAST_PATH or _compiling() or _function_mode() or _dispatch_modes() or _profiling():
        return False
    if _functorch_level() is not None:  # inside vmap / grad / jvp
        return False
    for t in tensors:
        if t is not None and type(t) is not Tensor:  # FakeTensor, DTensor, Parameter, ...
            return False
    return True


# ---- public functions ---------------------------------------------------------------------
def attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False,
              softmax_scale: Optional[float] = None, window: Tuple[int, int] = (-1, -1),
              softcap: float = 0.0, return_lse: bool = False, backend: str = "auto",
              deterministic: bool = False, q_descale: Optional[Tensor] = None,
              k_descale: Optional[Tensor] = None, v_descale: Optional[Tensor] = None,
              fp8_fast_accum: bool = False):
    """flashcpp.attention for torch tensors, differentiable and torch.compile-able.

    q [B, Nq, Hq, D], k [B, Nk, Hkv, D], v [B, Nk, Hkv, Dv]; causal is bottom-right aligned.
    Returns out [B, Nq, Hq, Dv] (and lse [B, Hq, Nq] float32 when return_lse).
    deterministic: the backward gives bitwise-identical gradients run to run (as does
    torch.use_deterministic_algorithms(True)).
    fp8: float8_e4m3fn q, k, v (out bfloat16) with q_descale/k_descale/v_descale float32
    [B, Hkv] or [1] tensors run through the op flashcpp::attention_fp8_fwd (inference only,
    no gradient). fp8_fast_accum=True: O stays in the tensor cores' accumulator along the row
    (faster; loses small terms on long rows: docs/semantics.md, "FP8").
    """
    o = _native.options(causal, softmax_scale, window, softcap, backend)
    if (q.dtype == _FP8 or fp8_fast_accum
            or any(d is not None for d in (q_descale, k_descale, v_descale))):
        out, lse = torch.ops.flashcpp.attention_fp8_fwd(
            q, k, v, o["causal"], o["softmax_scale"], o["window_left"], o["window_right"],
            o["softcap"], o["backend"], q_descale, k_descale, v_descale, bool(fp8_fast_accum))
        return (out, lse) if return_lse else out
    if _direct_call_ok(q, k, v) and not (torch.is_grad_enabled() and (
            q.requires_grad or k.requires_grad or v.requires_grad)):
        out, lse = _run_forward(q, k, v, _native.PADDED, o)  # no gradient to record
    else:
        out, lse = torch.ops.flashcpp.attention_fwd(q, k, v, o["causal"], o["softmax_scale"],
                                                    o["window_left"], o["window_right"],
                                                    o["softcap"], o["backend"],
                                                    bool(deterministic))
    return (out, lse) if return_lse else out


def attention_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                     cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int, *,
                     causal: bool = False, softmax_scale: Optional[float] = None,
                     window: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                     return_lse: bool = False, backend: str = "auto",
                     deterministic: bool = False):
    """flashcpp.attention_varlen for torch tensors, differentiable and torch.compile-able."""
    o = _native.options(causal, softmax_scale, window, softcap, backend)
    out, lse = torch.ops.flashcpp.attention_varlen_fwd(
        q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), o["causal"],
        o["softmax_scale"], o["window_left"], o["window_right"], o["softcap"], o["backend"],
        bool(deterministic))
    return (out, lse) if return_lse else out


def attention_with_kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor,
                           k: Optional[Tensor] = None, v: Optional[Tensor] = None, *,
                           cache_seqlens=None, block_table: Optional[Tensor] = None,
                           softmax_scale: Optional[float] = None, causal: bool = False,
                           window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                           return_softmax_lse: bool = False, num_splits: int = 0,
                           backend: str = "auto", k_descale: Optional[Tensor] = None,
                           v_descale: Optional[Tensor] = None):
    """flashcpp.attention_with_kvcache for torch tensors, as custom ops (torch.ops.flashcpp.
    attention_with_kvcache, and attention_with_kvcache_append when k and v are given, which
    declares that it mutates k_cache and v_cache): torch.compile(fullgraph=True) traces it, and
    a CUDA graph captures it, since cache_seqlens and block_table stay on the device (a replay
    reads their new contents) and the workspace comes from torch's allocator on the current
    stream. cache_seqlens: int32 [B] tensor, an int (broadcast) or None (the whole capacity).
    Inference only: no gradients flow through it. An fp8 (float8_e4m3fn) cache takes
    k_descale/v_descale, float32 [B, Hkv] or [1] tensors read on the device (a CUDA graph replay
    reads their new contents too).
    """
    o = _native.options(causal, softmax_scale, window_size, softcap, backend, num_splits)
    if (k is None) != (v is None):
        raise Error("k and v (the new keys and values to append) must be given together")
    if cache_seqlens is None or isinstance(cache_seqlens, (int, torch.SymInt)):
        length = cache_seqlens if cache_seqlens is not None else _native.cache_capacity(
            tuple(k_cache.shape), None if block_table is None else tuple(block_table.shape))
        cache_seqlens = torch.full((q.shape[0],), length, dtype=torch.int32, device=q.device)
    options = (o["causal"], o["softmax_scale"], o["window_left"], o["window_right"],
               o["softcap"], o["num_splits"], o["backend"], k_descale, v_descale)
    if k is None:
        if _direct_call_ok(q, k_cache, v_cache, cache_seqlens, block_table):
            # the op has no autograd formula and mutates nothing: its implementation is all
            out, lse = _run_kvcache(q, k_cache, v_cache, None, None, cache_seqlens, block_table,
                                    *options)
        else:
            out, lse = torch.ops.flashcpp.attention_with_kvcache(
                q, k_cache, v_cache, cache_seqlens, block_table, *options)
    else:
        out, lse = torch.ops.flashcpp.attention_with_kvcache_append(
            q, k_cache, v_cache, k, v, cache_seqlens, block_table, *options)
    return (out, lse) if return_softmax_lse else out


def sdpa(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = None,
         dropout_p: float = 0.0, is_causal: bool = False, scale: Optional[float] = None,
         enable_gqa: bool = False) -> Tensor:
    """A stand-in for F.scaled_dot_product_attention: [B, H, N, D] in, [B, H, N, Dv] out.

    The BHND tensors are viewed as BNHD (transposes, no copies). Differences, by choice:
    - attn_mask must be None and dropout_p 0 (ValueError otherwise);
    - is_causal with Nq != Nk raises ValueError: PyTorch's is_causal is top-left aligned there
      while flashcpp's causal is bottom-right aligned (as FlashAttention >= 2.1); call
      flashcpp.torch.attention(..., causal=True) for the bottom-right mask.
    Rank 3 inputs [H, N, D] are accepted too.
    """
    if attn_mask is not None:
        raise ValueError("flashcpp.torch.sdpa: attn_mask is not supported (only is_causal); "
                         "use F.scaled_dot_product_attention for arbitrary masks")
    if dropout_p != 0.0:
        raise ValueError(f"flashcpp.torch.sdpa: dropout_p must be 0 (got {dropout_p}); "
                         "flashcpp has no attention dropout")
    if query.dim() not in (3, 4) or key.dim() != query.dim() or value.dim() != query.dim():
        raise ValueError("flashcpp.torch.sdpa: expected query, key and value of rank 4 "
                         f"[B, H, N, D] (or 3), got {query.dim()}, {key.dim()}, {value.dim()}")
    heads_q, heads_kv = query.shape[-3], key.shape[-3]
    if heads_q != heads_kv and not enable_gqa:
        raise ValueError(f"flashcpp.torch.sdpa: query has {heads_q} heads but key has "
                         f"{heads_kv}; pass enable_gqa=True for grouped-query attention")
    if is_causal and query.shape[-2] != key.shape[-2]:
        raise ValueError(
            f"flashcpp.torch.sdpa: is_causal with Nq ({query.shape[-2]}) != Nk "
            f"({key.shape[-2]}) is top-left aligned in PyTorch but bottom-right aligned in "
            "flashcpp; use flashcpp.torch.attention(q, k, v, causal=True) (BNHD layout, "
            "bottom-right) if that is what you mean")
    squeeze = query.dim() == 3
    if squeeze:
        query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
    out = attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                    causal=is_causal, softmax_scale=scale)
    out = out.transpose(1, 2)
    return out.squeeze(0) if squeeze else out
