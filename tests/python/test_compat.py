"""flashcpp.compat: flash_attn's functions, names and return conventions, on the CPU backend
(NumPy always; PyTorch, with gradients, where it is installed)."""

import inspect

import numpy as np
import pytest

import _reference as ref
from flashcpp import compat

TOL = dict(rtol=2e-5, atol=2e-5)


def arrays(rng, *shapes):
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def test_flash_attn_func_matches_the_reference(rng):
    q, k, v = arrays(rng, (2, 9, 4, 32), (2, 13, 2, 32), (2, 13, 2, 32))
    out = compat.flash_attn_func(q, k, v, causal=True, window_size=(5, 0), softcap=3.0)
    want, _ = ref.forward(q, k, v, causal=True, window=(5, 0), softcap=3.0)
    np.testing.assert_allclose(out, want, **TOL)


def test_return_attn_probs_gives_out_lse_and_none(rng):
    q, k, v = arrays(rng, (1, 7, 2, 16), (1, 7, 2, 16), (1, 7, 2, 16))
    out, lse, probs = compat.flash_attn_func(q, k, v, 0.0, 0.5, True, return_attn_probs=True)
    want, want_lse = ref.forward(q, k, v, causal=True, scale=0.5)
    assert probs is None
    assert lse.shape == (1, 2, 7) and lse.dtype == np.float32
    np.testing.assert_allclose(out, want, **TOL)
    np.testing.assert_allclose(lse, want_lse, **TOL)


def test_varlen_matches_each_sequence(rng):
    lens_q, lens_k = [3, 8], [5, 8]
    cu_q = np.cumsum([0] + lens_q).astype(np.int32)
    cu_k = np.cumsum([0] + lens_k).astype(np.int32)
    q, k, v = arrays(rng, (sum(lens_q), 2, 16), (sum(lens_k), 1, 16), (sum(lens_k), 1, 16))
    out, lse, _ = compat.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                                causal=True, return_attn_probs=True)
    assert lse.shape == (2, sum(lens_q))
    for b in range(2):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        want, want_lse = ref.forward(q[None, rows], k[None, keys], v[None, keys], causal=True)
        np.testing.assert_allclose(out[rows], want[0], **TOL)
        np.testing.assert_allclose(lse[:, rows], want_lse[0], **TOL)


def test_packed_layouts_equal_the_unpacked_call(rng):
    qkv, = arrays(rng, (2, 6, 3, 2, 16))
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    want = compat.flash_attn_func(q, k, v, causal=True)
    np.testing.assert_array_equal(compat.flash_attn_qkvpacked_func(qkv, causal=True), want)
    kv = np.ascontiguousarray(qkv[:, :, 1:])
    np.testing.assert_array_equal(compat.flash_attn_kvpacked_func(q, kv, causal=True), want)

    cu = np.array([0, 6, 12], dtype=np.int32)
    flat = qkv.reshape(12, 3, 2, 16)
    want_varlen = compat.flash_attn_varlen_func(flat[:, 0], flat[:, 1], flat[:, 2], cu, cu, 6,
                                                6, causal=True)
    np.testing.assert_array_equal(want_varlen.reshape(want.shape), want)
    np.testing.assert_array_equal(
        compat.flash_attn_varlen_qkvpacked_func(flat, cu, 6, causal=True), want_varlen)
    np.testing.assert_array_equal(
        compat.flash_attn_varlen_kvpacked_func(flat[:, 0], flat[:, 1:], cu, cu, 6, 6,
                                               causal=True), want_varlen)


def test_with_kvcache_appends_and_attends(rng):
    q, k_new, v_new = arrays(rng, (2, 1, 4, 32), (2, 1, 2, 32), (2, 1, 2, 32))
    k_cache, v_cache = arrays(rng, (2, 10, 2, 32), (2, 10, 2, 32))
    lens = np.array([4, 7], dtype=np.int32)
    out, lse = compat.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new,
                                              cache_seqlens=lens, causal=True,
                                              return_softmax_lse=True)
    assert lse.shape == (2, 4, 1)
    for b, n in enumerate(lens):
        np.testing.assert_array_equal(k_cache[b, n], k_new[b, 0])
        want, _ = ref.forward(q[b:b + 1], k_cache[b:b + 1, :n + 1], v_cache[b:b + 1, :n + 1],
                              causal=True)
        np.testing.assert_allclose(out[b], want[0], **TOL)


@pytest.mark.parametrize("call", [
    lambda q: compat.flash_attn_func(q, q, q, dropout_p=0.1),
    lambda q: compat.flash_attn_func(q, q, q, alibi_slopes=np.ones(2, np.float32)),
    lambda q: compat.flash_attn_qkvpacked_func(np.stack([q] * 3, 2), 0.5),
    lambda q: compat.flash_attn_with_kvcache(q, q, q, rotary_cos=q, rotary_sin=q),
    lambda q: compat.flash_attn_with_kvcache(q, q, q, cache_batch_idx=np.zeros(1, np.int32)),
    lambda q: compat.flash_attn_with_kvcache(q, q, q, cache_leftpad=np.zeros(1, np.int32)),
], ids=["dropout", "alibi", "packed-dropout", "rotary", "cache_batch_idx", "cache_leftpad"])
def test_what_flashcpp_lacks_raises_clearly(rng, call):
    q, = arrays(rng, (1, 4, 2, 16))
    with pytest.raises(NotImplementedError, match="flashcpp.compat.flash_attn_"):
        call(q)


def test_signatures_follow_flash_attn():
    params = inspect.signature(compat.flash_attn_func).parameters
    assert list(params) == ["q", "k", "v", "dropout_p", "softmax_scale", "causal",
                            "window_size", "softcap", "alibi_slopes", "deterministic",
                            "return_attn_probs"]
    assert params["window_size"].default == (-1, -1)
    kvcache = list(inspect.signature(compat.flash_attn_with_kvcache).parameters)
    assert kvcache[:11] == ["q", "k_cache", "v_cache", "k", "v", "rotary_cos", "rotary_sin",
                            "cache_seqlens", "cache_batch_idx", "cache_leftpad", "block_table"]
    varlen = list(inspect.signature(compat.flash_attn_varlen_func).parameters)
    assert varlen[:8] == ["q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q",
                          "max_seqlen_k", "dropout_p"]


def test_torch_gradients_flow_through_packed_qkv(rng):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    qkv = torch.tensor(rng.standard_normal((1, 6, 3, 2, 16)), dtype=torch.float32,
                       requires_grad=True)
    out = compat.flash_attn_qkvpacked_func(qkv, causal=True, deterministic=True)
    out.square().sum().backward()
    grad = qkv.grad.clone()

    dense = qkv.detach().clone().requires_grad_(True)
    q, k, v = (dense[:, :, i].transpose(1, 2) for i in range(3))
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    want.transpose(1, 2).square().sum().backward()
    torch.testing.assert_close(out, want.transpose(1, 2).detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad, dense.grad, rtol=1e-4, atol=1e-4)


def test_torch_deterministic_backward_is_bitwise_repeatable(rng):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    q, k, v = (torch.tensor(a, requires_grad=True)
               for a in arrays(rng, (1, 33, 2, 32), (1, 33, 2, 32), (1, 33, 2, 32)))
    grads = []
    for _ in range(2):
        out = compat.flash_attn_func(q, k, v, causal=True, deterministic=True)
        grads.append(torch.autograd.grad(out.sum(), (q, k, v)))
    for first, second in zip(*grads):
        assert torch.equal(first, second)
