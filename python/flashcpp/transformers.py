"""Hugging Face transformers integration: attn_implementation="flashcpp".

    import flashcpp.transformers                        # registers "flashcpp"
    model = AutoModelForCausalLM.from_config(config, attn_implementation="flashcpp")

Importing this module registers flashcpp_attention_forward with transformers'
AttentionInterface, and a mask function with AttentionMaskInterface that hands the attention
function None when there is no padding (as for FlashAttention-2), so causal models run
with flashcpp's bottom-right causal mask (which is also what decoding with a KV cache needs).

transformers treats any implementation name containing "flash" as a FlashAttention kernel to
fetch; registering "flashcpp" therefore also tells transformers' loader to skip that name.

Decode steps (a causal call with at most DECODE_MAX_QUERY queries against a longer key
sequence, as with a DynamicCache) run flashcpp.torch.attention_with_kvcache over the cache
transformers hands in, read in place; prefill runs flashcpp.torch.attention.

Padding masks (batched generate() with a padded attention_mask) and static caches
(cache_implementation="static", whose slots past the tokens seen so far are unused) arrive as
the 2-D [B, L] mask of the first L key positions: the kept tokens are packed into one
flashcpp.torch.attention_varlen call and its output re-padded (zeros at padding positions), as
transformers' FlashAttention-2 backend does (flashcpp/_padding.py). A static cache without
padding is read in place: its first L positions.

Supported: causal and bidirectional attention (module.is_causal or the is_causal keyword),
GQA/MQA (fewer key/value heads), `scaling`, `sliding_window`, `softcap`, padding masks, static
caches, packed sequences (cu_seq_lens_q/k with batch size 1). Not supported, with a ValueError:
attention dropout, attention sinks (s_aux). Under torch.compile, call the model with
attention_mask=None: checking a given mask for padding, and packing the kept tokens, read it on
the host.
"""

import torch
from transformers import AttentionInterface, AttentionMaskInterface

from . import torch as flashcpp_torch
from ._padding import repad, unpad

__all__ = ["flashcpp_attention_forward", "flashcpp_mask", "register", "NAME"]

NAME = "flashcpp"

# Causal calls with at most this many queries, against a longer key sequence, are decode steps
# (one token, or a few being verified in speculative decoding) and take the KV-cache path;
# longer ones (prefill, chunked prefill) take the forward's tiles.
DECODE_MAX_QUERY = 16


def flashcpp_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                  attention_mask=None, **kwargs):
    """transformers mask function for "flashcpp": None unless there is real padding, or the
    mask covers fewer keys than the call sees (a static cache's unused slots).

    attention_mask is the user's 2-D [B, kv] padding mask (or None). When every key is kept,
    the causal/sliding structure is expressed through is_causal and sliding_window instead.
    """
    if attention_mask is None:
        return None
    attention_mask = attention_mask[:, -kv_length:]
    if attention_mask.shape[1] == kv_length and bool(attention_mask.all()):
        return None
    return attention_mask


def flashcpp_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                               value: torch.Tensor, attention_mask, scaling=None, dropout=0.0,
                               sliding_window=None, softcap=None, is_causal=None, s_aux=None,
                               **kwargs):
    """transformers attention function: query [B, Hq, N, D], key/value [B, Hkv, Nk, D] in,
    (attn_output [B, N, Hq, D], None) out. attention_mask: None, or flashcpp_mask's [B, L]."""
    if dropout:
        raise ValueError(f"flashcpp attention: attention dropout is not supported (got {dropout}); "
                         "set config.attention_dropout=0 or call model.eval()")
    if s_aux is not None:
        raise ValueError("flashcpp attention: attention sinks (s_aux) are not supported")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    window = (-1, -1)
    if sliding_window is not None and sliding_window > 0:
        # The same window as transformers' FlashAttention-2 path: sliding_window - 1 keys back
        # (and forward, when bidirectional), around the bottom-right diagonal.
        window = (sliding_window - 1, -1 if is_causal else sliding_window - 1)
    softcap = float(softcap) if softcap else 0.0
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    options = dict(causal=bool(is_causal), softmax_scale=scaling, window=window,
                   softcap=softcap)
    if attention_mask is not None:
        if attention_mask.dim() != 2:
            raise ValueError("flashcpp attention: expected the 2-D [batch, keys] padding mask "
                             f"of flashcpp_mask, got shape {tuple(attention_mask.shape)}")
        if not bool(attention_mask.all()):
            return _padded_attention(q, k, v, attention_mask, options), None
        # No padding, only fewer keys than the cache holds (a static cache): its first L.
        k, v = k[:, :attention_mask.shape[1]], v[:, :attention_mask.shape[1]]
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    packed = cu_q is not None and cu_k is not None
    if (is_causal and not packed and q.shape[1] <= DECODE_MAX_QUERY and q.shape[1] < k.shape[1]
            and not any(t.requires_grad for t in (query, key, value))):
        # A decode step: key and value are the whole cache, this step's tokens included
        # (transformers updated it before calling), so every sequence holds all k.shape[1]
        # keys and nothing is appended. The BHND cache is read in place as a strided BNHD
        # view. (The KV-cache op has no gradient: calls that need one stay on the forward.)
        out = flashcpp_torch.attention_with_kvcache(
            q, k, v, cache_seqlens=k.shape[1], softmax_scale=scaling, causal=True,
            window_size=window, softcap=softcap)
        return out, None
    if packed:
        # Packed sequences (padding-free training): one row of B = 1 holds them all.
        if q.shape[0] != 1:
            raise ValueError("flashcpp attention: cu_seq_lens_q/k need batch size 1 (packed), "
                             f"got {q.shape[0]}")
        out = flashcpp_torch.attention_varlen(
            q[0], k[0], v[0], cu_q.to(torch.int32), cu_k.to(torch.int32),
            int(kwargs["max_length_q"]), int(kwargs["max_length_k"]), **options)
        return out.unsqueeze(0), None
    return flashcpp_torch.attention(q, k, v, **options), None


def _padded_attention(q, k, v, mask, options):
    """A padded batch as one varlen call over its kept tokens, re-padded with zeros."""
    packed = unpad(q, k, v, mask)
    out = flashcpp_torch.attention_varlen(packed.q, packed.k, packed.v, packed.cu_seqlens_q,
                                          packed.cu_seqlens_k, packed.max_seqlen_q,
                                          packed.max_seqlen_k, **options)
    return repad(out, packed.query_rows, q.shape[0], q.shape[1])


def _skip_flash_attention_loader(names) -> None:
    """transformers (5.x) treats every attn_implementation whose name contains "flash" as a
    FlashAttention kernel to load at model construction; ours is already registered and loads
    nothing, so the loader is told to pass over these names (other names are untouched)."""
    try:
        import transformers.modeling_utils as modeling_utils
    except ImportError:
        return
    original = getattr(modeling_utils, "lazy_import_flash_attention", None)
    if original is None:
        return
    skipped = getattr(original, "_flashcpp_names", None)
    if skipped is not None:
        skipped.update(names)
        return

    def lazy_import_flash_attention(implementation, *args, **kwargs):
        if implementation in lazy_import_flash_attention._flashcpp_names:
            return (None, None, None, None, None), None
        return original(implementation, *args, **kwargs)

    lazy_import_flash_attention._flashcpp_names = set(names)
    modeling_utils.lazy_import_flash_attention = lazy_import_flash_attention


def register(name: str = NAME) -> None:
    """Registers the attention and mask functions under `name` (done on import for "flashcpp")."""
    AttentionInterface.register(name, flashcpp_attention_forward)
    AttentionMaskInterface.register(name, flashcpp_mask)
    if "flash" in name:
        _skip_flash_attention_loader({name, f"paged|{name}"})


register()
