"""FlashAttention 2's Python functions, served by flashcpp: migrating is an import change.

    # from flash_attn import flash_attn_func, flash_attn_varlen_func
    from flashcpp.compat import flash_attn_func, flash_attn_varlen_func

Same names, positional order, keywords, defaults, layouts and return values as flash_attn
(2.6+): q [B, Nq, Hq, D], k/v [B, Nk, Hkv, D]; causal and window_size bottom-right aligned;
softmax_lse [B, Hq, Nq] float32 ([Hq, total_q] for varlen). return_attn_probs=True returns
(out, softmax_lse, None): flash_attn's third value is the dropout mask, and flashcpp has no
dropout. PyTorch tensors that require grad are differentiable (deterministic=True makes the
backward bitwise reproducible); NumPy, CuPy and other DLPack arrays work for inference.

What flashcpp does not offer raises NotImplementedError (never a silent fallback): dropout_p
other than 0, alibi_slopes, and for flash_attn_with_kvcache rotary embedding (rotary_cos/sin),
cache_batch_idx and cache_leftpad.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

from . import _api
from ._frameworks import framework_of

__all__ = [
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
]


def _refuse(function: str, argument: str, value: Any, why: str) -> None:
    raise NotImplementedError(f"flashcpp.compat.{function}: {argument}={value!r} is not "
                              f"supported ({why})")


def _check_unsupported(function: str, dropout_p: float, alibi_slopes: Any) -> None:
    if dropout_p:
        _refuse(function, "dropout_p", dropout_p,
                "flashcpp has no attention dropout; pass 0.0, e.g. in eval mode")
    if alibi_slopes is not None:
        _refuse(function, "alibi_slopes", "<tensor>", "flashcpp has no ALiBi bias")


def _attend(q, k, v, varlen, softmax_scale, causal, window_size, softcap, deterministic,
            return_attn_probs):
    """One forward through flashcpp, differentiable where q's framework needs it."""
    options = dict(causal=causal, softmax_scale=softmax_scale, window=tuple(window_size),
                   softcap=softcap, return_lse=return_attn_probs)
    ops = framework_of(q).autograd_ops(q, k, v)
    if varlen is None:
        result = (ops.attention(q, k, v, deterministic=deterministic, **options)
                  if ops is not None else _api.attention(q, k, v, **options))
    else:
        result = (ops.attention_varlen(q, k, v, *varlen, deterministic=deterministic, **options)
                  if ops is not None else _api.attention_varlen(q, k, v, *varlen, **options))
    if return_attn_probs:
        out, lse = result
        return out, lse, None
    return result


def flash_attn_func(q, k, v, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                    causal: bool = False, window_size: Tuple[int, int] = (-1, -1),
                    softcap: float = 0.0, alibi_slopes=None, deterministic: bool = False,
                    return_attn_probs: bool = False):
    """q [B, Nq, Hq, D], k/v [B, Nk, Hkv, D] -> out [B, Nq, Hq, D]
    (with return_attn_probs: (out, softmax_lse [B, Hq, Nq], None))."""
    _check_unsupported("flash_attn_func", dropout_p, alibi_slopes)
    return _attend(q, k, v, None, softmax_scale, causal, window_size, softcap, deterministic,
                   return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int,
                           max_seqlen_k: int, dropout_p: float = 0.0,
                           softmax_scale: Optional[float] = None, causal: bool = False,
                           window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                           alibi_slopes=None, deterministic: bool = False,
                           return_attn_probs: bool = False, block_table=None):
    """Packed sequences: q [total_q, Hq, D], k/v [total_k, Hkv, D], cu_seqlens int32 [B + 1]
    -> out [total_q, Hq, D] (with return_attn_probs: (out, softmax_lse [Hq, total_q], None))."""
    _check_unsupported("flash_attn_varlen_func", dropout_p, alibi_slopes)
    if block_table is not None:
        _refuse("flash_attn_varlen_func", "block_table", "<tensor>",
                "a paged KV cache is read by flash_attn_with_kvcache")
    return _attend(q, k, v, (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k),
                   softmax_scale, causal, window_size, softcap, deterministic,
                   return_attn_probs)


def flash_attn_qkvpacked_func(qkv, dropout_p: float = 0.0,
                              softmax_scale: Optional[float] = None, causal: bool = False,
                              window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                              alibi_slopes=None, deterministic: bool = False,
                              return_attn_probs: bool = False):
    """qkv [B, N, 3, H, D] (q, k and v stacked on dim 2, read as strided views)."""
    _check_unsupported("flash_attn_qkvpacked_func", dropout_p, alibi_slopes)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    return _attend(q, k, v, None, softmax_scale, causal, window_size, softcap, deterministic,
                   return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p: float = 0.0,
                             softmax_scale: Optional[float] = None, causal: bool = False,
                             window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                             alibi_slopes=None, deterministic: bool = False,
                             return_attn_probs: bool = False):
    """q [B, Nq, Hq, D], kv [B, Nk, 2, Hkv, D] (k and v stacked on dim 2)."""
    _check_unsupported("flash_attn_kvpacked_func", dropout_p, alibi_slopes)
    return _attend(q, kv[:, :, 0], kv[:, :, 1], None, softmax_scale, causal, window_size,
                   softcap, deterministic, return_attn_probs)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen: int, dropout_p: float = 0.0,
                                     softmax_scale: Optional[float] = None,
                                     causal: bool = False,
                                     window_size: Tuple[int, int] = (-1, -1),
                                     softcap: float = 0.0, alibi_slopes=None,
                                     deterministic: bool = False,
                                     return_attn_probs: bool = False):
    """qkv [total, 3, H, D], one cu_seqlens for queries and keys."""
    _check_unsupported("flash_attn_varlen_qkvpacked_func", dropout_p, alibi_slopes)
    return _attend(qkv[:, 0], qkv[:, 1], qkv[:, 2],
                   (cu_seqlens, cu_seqlens, max_seqlen, max_seqlen), softmax_scale, causal,
                   window_size, softcap, deterministic, return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int,
                                    max_seqlen_k: int, dropout_p: float = 0.0,
                                    softmax_scale: Optional[float] = None,
                                    causal: bool = False,
                                    window_size: Tuple[int, int] = (-1, -1),
                                    softcap: float = 0.0, alibi_slopes=None,
                                    deterministic: bool = False,
                                    return_attn_probs: bool = False):
    """q [total_q, Hq, D], kv [total_k, 2, Hkv, D]."""
    _check_unsupported("flash_attn_varlen_kvpacked_func", dropout_p, alibi_slopes)
    return _attend(q, kv[:, 0], kv[:, 1],
                   (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k), softmax_scale,
                   causal, window_size, softcap, deterministic, return_attn_probs)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, block_table=None,
                            softmax_scale: Optional[float] = None, causal: bool = False,
                            window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                            rotary_interleaved: bool = True, alibi_slopes=None,
                            num_splits: int = 0, return_softmax_lse: bool = False):
    """New tokens q [B, Nnew, Hq, D] against a (paged) KV cache, appending k/v when given, as
    flashcpp.attention_with_kvcache (docs/semantics.md). Returns out, or (out, softmax_lse)
    with return_softmax_lse. Inference only."""
    name = "flash_attn_with_kvcache"
    if rotary_cos is not None or rotary_sin is not None:
        _refuse(name, "rotary_cos/rotary_sin", "<tensor>",
                "apply the rotary embedding to q and k before the call")
    if cache_batch_idx is not None:
        _refuse(name, "cache_batch_idx", "<tensor>", "index the caches before the call")
    if cache_leftpad is not None:
        _refuse(name, "cache_leftpad", "<tensor>", "sequences start at row 0 of their cache")
    _check_unsupported(name, 0.0, alibi_slopes)
    return _api.attention_with_kvcache(
        q, k_cache, v_cache, k, v, cache_seqlens=cache_seqlens, block_table=block_table,
        softmax_scale=softmax_scale, causal=causal, window_size=tuple(window_size),
        softcap=softcap, return_softmax_lse=return_softmax_lse, num_splits=num_splits)
