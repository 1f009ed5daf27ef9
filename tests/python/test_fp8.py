"""float8 e4m3 inputs through flashcpp.attention and flashcpp.attention_with_kvcache (PyTorch
tensors, torch.float8_e4m3fn): the forward of fp8 q, k, v with descales and the KV cache in
fp8 (quantising appends), against a float64 computation on the dequantised values; on the
CPU (the float64 reference runs them) and, for the KV cache, on CUDA (the decode kernel).
"""

import numpy as np
import pytest

import flashcpp

torch = pytest.importorskip("torch")
if not hasattr(torch, "float8_e4m3fn"):
    pytest.skip("this PyTorch has no float8_e4m3fn", allow_module_level=True)

FP8 = torch.float8_e4m3fn


def attention64(q, k, v, causal=False):
    """float64 attention of [B, N, H, D] arrays (GQA by repeating kv heads)."""
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    group = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    if causal:
        nq, nk = q.shape[1], k.shape[1]
        mask = np.arange(nk)[None, :] > np.arange(nq)[:, None] + nk - nq
        s = np.where(mask, -np.inf, s)
    s -= s.max(-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", p, v)


def per_head(descale, heads_q):
    """[B, Hkv] factors as [B, 1, Hq, 1] for the query heads."""
    d = descale.double().numpy()
    return np.repeat(d, heads_q // d.shape[1], axis=1)[:, None, :, None]


def test_forward_fp8_with_descales_on_cpu():
    g = torch.Generator().manual_seed(0)
    B, N, Hq, Hkv, D = 2, 33, 8, 2, 64
    q = (torch.randn(B, N, Hq, D, generator=g) * 2).to(FP8)
    k = (torch.randn(B, N, Hkv, D, generator=g) * 2).to(FP8)
    v = (torch.randn(B, N, Hkv, D, generator=g) * 2).to(FP8)
    q_descale = torch.rand(B, Hkv, generator=g) + 0.25
    k_descale = torch.rand(B, Hkv, generator=g) + 0.25
    v_descale = torch.tensor([0.75])
    out = flashcpp.attention(q, k, v, causal=True, q_descale=q_descale, k_descale=k_descale,
                             v_descale=v_descale)
    assert out.dtype == torch.bfloat16
    assert flashcpp.last_run_info().backend == "cpu_reference"
    kf = k_descale.double().numpy()[:, None, :, None]
    want = attention64(q.float().numpy() * per_head(q_descale, Hq), k.float().numpy() * kf,
                       v.float().numpy() * 0.75, causal=True)
    np.testing.assert_allclose(out.float().numpy(), want, atol=2.0**-7 * max(1, np.abs(want).max()))


def test_forward_fp8_errors():
    q = torch.zeros(1, 4, 2, 64).to(FP8)
    with pytest.raises(flashcpp.Error, match="k: expected dtype fp8_e4m3"):
        flashcpp.attention(q, torch.zeros(1, 4, 2, 64, dtype=torch.bfloat16), q)
    with pytest.raises(flashcpp.Error, match="backend: cpu does not take fp8_e4m3"):
        flashcpp.attention(q, q, q, backend="cpu")
    with pytest.raises(flashcpp.Error, match="k_descale: expected shape"):
        flashcpp.attention(q, q, q, k_descale=torch.ones(3, 3))


def kvcache_case(page_size):
    """Host tensors of a KV-cache call: fp8 caches (NaN codes in every row no sequence owns),
    bf16 q and new tokens, per (sequence, kv head) descales."""
    g = torch.Generator().manual_seed(1)
    B, Hq, Hkv, D, capacity = 3, 16, 2, 128, 512
    c = dict(lens=[0, 37, 300], nnew=2)
    if page_size:
        pages = capacity // page_size
        c["table"] = torch.randperm(B * pages + 2, generator=g)[:B * pages].reshape(B, pages).int()
        shape = (B * pages + 2, page_size)
    else:
        c["table"], shape = None, (B, capacity)

    def rows(b, start, stop):
        pos = torch.arange(start, stop)
        if c["table"] is None:
            return torch.full_like(pos, b), pos
        return c["table"][b, pos // page_size].long(), pos % page_size

    c["rows"] = rows
    c["k_cache"] = torch.full(shape + (Hkv, D), float("nan")).to(FP8)
    c["v_cache"] = torch.full(shape + (Hkv, D), float("nan")).to(FP8)
    c["keys"] = [torch.randn(n, Hkv, D, generator=g).to(FP8) for n in c["lens"]]
    c["values"] = [torch.randn(n, Hkv, D, generator=g).to(FP8) for n in c["lens"]]
    for b, n in enumerate(c["lens"]):
        c["k_cache"][rows(b, 0, n)] = c["keys"][b]
        c["v_cache"][rows(b, 0, n)] = c["values"][b]
    c["q"] = torch.randn(B, c["nnew"], Hq, D, generator=g).bfloat16()
    c["k_new"] = torch.randn(B, c["nnew"], Hkv, D, generator=g).bfloat16()
    c["v_new"] = torch.randn(B, c["nnew"], Hkv, D, generator=g).bfloat16()
    c["k_descale"] = torch.rand(B, Hkv, generator=g) * 0.75 + 0.25
    c["v_descale"] = torch.rand(B, Hkv, generator=g) * 0.75 + 0.25
    return c


def expected_kvcache(c):
    """float64 result and the appended fp8 rows: e4m3(float32(x / descale)) per (b, kv head)."""
    outs, appended = [], []
    for b, n in enumerate(c["lens"]):
        kd, vd = c["k_descale"][b][None, :, None], c["v_descale"][b][None, :, None]
        k_new = (c["k_new"][b].float() / kd).to(FP8)
        v_new = (c["v_new"][b].float() / vd).to(FP8)
        appended.append((k_new, v_new))
        k = torch.cat([c["keys"][b], k_new]).double() * kd.double()
        v = torch.cat([c["values"][b], v_new]).double() * vd.double()
        outs.append(attention64(c["q"][b:b + 1].double().numpy(), k[None].numpy(), v[None].numpy(),
                                causal=True)[0])
    return np.stack(outs), appended


def run_kvcache(device, page_size):
    c = kvcache_case(page_size)
    k_cache, v_cache = c["k_cache"].to(device), c["v_cache"].to(device)
    out = flashcpp.attention_with_kvcache(
        c["q"].to(device), k_cache, v_cache, c["k_new"].to(device), c["v_new"].to(device),
        cache_seqlens=torch.tensor(c["lens"], dtype=torch.int32, device=device),
        block_table=None if c["table"] is None else c["table"].to(device), causal=True,
        k_descale=c["k_descale"].to(device), v_descale=c["v_descale"].to(device))
    assert out.dtype == torch.bfloat16
    out, k_cache, v_cache = out.cpu(), k_cache.cpu(), v_cache.cpu()
    want, appended = expected_kvcache(c)
    np.testing.assert_allclose(out.float().numpy(), want, atol=2e-2)
    for b, n in enumerate(c["lens"]):
        rows = c["rows"](b, n, n + c["nnew"])
        assert torch.equal(k_cache[rows].view(torch.uint8), appended[b][0].view(torch.uint8))
        assert torch.equal(v_cache[rows].view(torch.uint8), appended[b][1].view(torch.uint8))


@pytest.mark.parametrize("page_size", [None, 16])
def test_kvcache_fp8_on_cpu(page_size):
    run_kvcache("cpu", page_size)
    assert flashcpp.last_run_info().backend == "cpu_reference"


@pytest.mark.skipif(not flashcpp.cuda_available(), reason="no CUDA GPU")
@pytest.mark.parametrize("page_size", [None, 16])
def test_kvcache_fp8_on_cuda(page_size):
    run_kvcache("cuda", page_size)
    assert flashcpp.last_run_info().backend.startswith("cuda")


def test_kvcache_fp8_through_the_custom_ops_on_cpu():
    """flashcpp.torch's ops take the fp8 cache and its descales (what torch.compile and CUDA
    graphs go through) and give the eager call's result."""
    import flashcpp.torch as fa

    results = []
    for call in (flashcpp.attention_with_kvcache, fa.attention_with_kvcache):
        c = kvcache_case(16)
        out = call(c["q"], c["k_cache"], c["v_cache"], c["k_new"], c["v_new"],
                   cache_seqlens=torch.tensor(c["lens"], dtype=torch.int32),
                   block_table=c["table"], causal=True, k_descale=c["k_descale"],
                   v_descale=c["v_descale"])
        results.append((out, c["k_cache"].view(torch.uint8)))
    # The same cache bits; out within one bf16 rounding (on the 16-core GPU host the two runs
    # of the threaded CPU reference differed in the last bit of a few elements).
    torch.testing.assert_close(results[0][0], results[1][0], rtol=2.0**-7, atol=1e-6)
    assert torch.equal(results[0][1], results[1][1])
    c = kvcache_case(None)
    options = (True, None, -1, -1, 0.0, 0, "auto", c["k_descale"], c["v_descale"])
    lens = torch.tensor(c["lens"], dtype=torch.int32)
    torch.library.opcheck(torch.ops.flashcpp.attention_with_kvcache.default,
                          (c["q"], c["k_cache"], c["v_cache"], lens, None, *options),
                          test_utils=("test_faketensor",))  # test_schema multiplies fp8
