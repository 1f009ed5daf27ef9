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


def fp8_forward_case(device, B=2, Nq=300, Nk=513, Hq=8, Hkv=2, D=128, seed=2):
    """fp8 codes of Gaussian q, k, v (descales sized so codes stay well inside 448) and their
    per (sequence, kv head) descales, on `device`."""
    g = torch.Generator().manual_seed(seed)
    dq = torch.rand(B, Hkv, generator=g) * 0.02 + 0.02
    dk = torch.rand(B, Hkv, generator=g) * 0.02 + 0.02
    dv = torch.tensor([0.03])
    q = (torch.randn(B, Nq, Hq, D, generator=g) / per_head_t(dq, Hq)).to(FP8)
    k = (torch.randn(B, Nk, Hkv, D, generator=g) / dk[:, None, :, None]).to(FP8)
    v = (torch.randn(B, Nk, Hkv, D, generator=g) / dv).to(FP8)
    return [t.to(device) for t in (q, k, v, dq, dk, dv)]


def per_head_t(descale, heads_q):
    return descale.repeat_interleave(heads_q // descale.shape[1], dim=1)[:, None, :, None]


def expected_fp8_forward(q, k, v, dq, dk, dv, causal, fast_accum=False):
    """float64 attention of the dequantised inputs, and the FP8 bound of docs/semantics.md per
    element of out (the tensor cores' score error E = 2^-8 x scale x descales x sum |q_c k_c|
    of the codes, e4m3 P with its subnormals, the P V sums; |v - ref| <= |v| + |ref| here).
    fast_accum: the P V term for O carried along the row, (ceil(n / 32) + 8) x 2^-8 with n
    the row's visible keys (here Nk for every row: an upper bound)."""
    Hq = q.shape[2]
    qc, kc, vc = (t.cpu().double().numpy() for t in (q, k, v))
    group = Hq // kc.shape[2]
    sq = per_head(dq.cpu(), Hq)
    sk = np.repeat(dk.cpu().double().numpy(), group, axis=1)[:, None, :, None]
    vd = np.repeat(vc * float(dv.cpu()[0]), group, axis=2)
    kc = np.repeat(kc, group, axis=2)
    scale = 1 / np.sqrt(qc.shape[-1])
    sc = (sq * sk)[:, 0, :, 0][:, :, None, None] * scale  # [B, H, 1, 1]
    s = np.einsum("bqhd,bkhd->bhqk", qc, kc) * sc
    e = 2.0**-8 * np.einsum("bqhd,bkhd->bhqk", np.abs(qc), np.abs(kc)) * sc
    if causal:
        nq, nk = qc.shape[1], kc.shape[1]
        mask = np.arange(nk)[None, :] > np.arange(nq)[:, None] + nk - nq
        s = np.where(mask, -np.inf, s)
    m = s.max(-1, keepdims=True)
    w = np.exp(s - m)
    lse = m + np.log(w.sum(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    e_hat = np.log((w * np.exp(e)).sum(-1, keepdims=True))
    f = np.exp(e + e_hat)
    sub = np.minimum(w * np.exp(e), 2.0**-10 * np.exp((s + e).max(-1, keepdims=True) - lse))
    av = np.abs(vd)
    ref = np.einsum("bhqk,bkhd->bqhd", w, vd)
    moved = np.einsum("bhqk,bkhd->bqhd", w * (f - 1), av) + \
        np.abs(ref) * (w * (f - 1)).sum(-1).transpose(0, 2, 1)[..., None]
    rel = np.einsum("bhqk,bkhd->bqhd", w * f, av)
    subnormal = np.exp(e_hat[..., 0]).transpose(0, 2, 1)[..., None] * \
        np.einsum("bhqk,bkhd->bqhd", sub, av)
    pv_steps = np.ceil(kc.shape[1] / 32) + 8 if fast_accum else 1
    bound = 2.0**-8 * np.abs(ref) + moved + (2.0**-4 + 2.0**-8 * pv_steps) * rel + subnormal + 1e-3
    return ref, bound


def sm90_available():
    return flashcpp.cuda_available() and torch.cuda.is_available() and \
        torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.skipif(not sm90_available(), reason="needs a Hopper (sm90) GPU")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("fast", [False, True])
def test_forward_fp8_on_cuda(causal, fast):
    """flashcpp.attention, flashcpp.torch.attention (the custom op) and a torch.compile'd call
    on float8_e4m3fn CUDA tensors with descale tensors: the sm90a FP8 forward, within the FP8
    bound of docs/semantics.md (expected_fp8_forward); fast: fp8_fast_accum=True."""
    import flashcpp.torch as fa

    q, k, v, dq, dk, dv = fp8_forward_case("cuda")
    want, bound = expected_fp8_forward(q, k, v, dq, dk, dv, causal, fast)
    kw = dict(causal=causal, q_descale=dq, k_descale=dk, v_descale=dv, fp8_fast_accum=fast)
    calls = [lambda: flashcpp.attention(q, k, v, **kw),
             lambda: fa.attention(q, k, v, **kw),
             torch.compile(lambda: fa.attention(q, k, v, **kw), fullgraph=True)]
    for i, call in enumerate(calls):
        out = call()
        assert out.dtype == torch.bfloat16
        if i == 0:
            info = flashcpp.last_run_info()
            assert info.backend == "cuda_sm90" and "fp8_e4m3" in info.kernel, info
            assert info.kernel.endswith("_fastaccum") == fast, info
        err = np.abs(out.float().cpu().numpy() - want)
        assert (err <= bound).all(), (i, err.max())


@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=pytest.mark.skipif(not sm90_available(),
                                                         reason="needs a Hopper (sm90) GPU"))])
def test_forward_fp8_fp16_out(device):
    """An fp16 out passed as out= for fp8 q, k, v: written in place (NaN before the call),
    the same attention as the default bf16 out within bf16's rounding."""
    q, k, v, dq, dk, dv = fp8_forward_case(device, Nq=130, Nk=200, D=64)
    kw = dict(causal=True, q_descale=dq, k_descale=dk, v_descale=dv)
    want = flashcpp.attention(q, k, v, **kw)
    out = torch.full(want.shape, float("nan"), dtype=torch.float16, device=device)
    got = flashcpp.attention(q, k, v, out=out, **kw)
    assert got.dtype == torch.float16 and got.data_ptr() == out.data_ptr()
    assert flashcpp.last_run_info().backend.startswith("cuda" if device == "cuda" else "cpu")
    torch.testing.assert_close(out.float(), want.float(), rtol=2.0**-7, atol=2.0**-9)


def test_forward_fp8_custom_op_on_cpu():
    """The fp8 op (flashcpp::attention_fp8_fwd) on CPU tensors runs the reference: the eager
    call's result, and fake tensors of the right dtype."""
    import flashcpp.torch as fa

    q, k, v, dq, dk, dv = fp8_forward_case("cpu", Nq=17, Nk=40, D=64)
    eager = flashcpp.attention(q, k, v, causal=True, q_descale=dq, k_descale=dk, v_descale=dv)
    op = fa.attention(q, k, v, causal=True, q_descale=dq, k_descale=dk, v_descale=dv)
    assert op.dtype == torch.bfloat16
    torch.testing.assert_close(op, eager, rtol=2.0**-7, atol=1e-6)
    torch.library.opcheck(torch.ops.flashcpp.attention_fp8_fwd.default,
                          (q, k, v, True, None, -1, -1, 0.0, "auto", dq, dk, dv),
                          test_utils=("test_faketensor",))
    torch.library.opcheck(torch.ops.flashcpp.attention_fp8_fwd.default,
                          (q, k, v, True, None, -1, -1, 0.0, "auto", dq, dk, dv, True),
                          test_utils=("test_faketensor",))


def test_forward_fp8_fast_accum_on_cpu():
    """fp8_fast_accum=True is accepted for fp8 inputs (the CPU's float64 reference computes
    exactly either way: the same out), through flashcpp.attention, attention_varlen and the
    custom op; for 16-bit inputs it is an error naming it."""
    import flashcpp.torch as fa

    q, k, v, dq, dk, dv = fp8_forward_case("cpu", Nq=17, Nk=40, D=64)
    kw = dict(causal=True, q_descale=dq, k_descale=dk, v_descale=dv)
    want = flashcpp.attention(q, k, v, **kw)
    for call in (flashcpp.attention, fa.attention):
        assert torch.equal(call(q, k, v, fp8_fast_accum=True, **kw), want)
    cu = torch.tensor([0, 17], dtype=torch.int32)
    cuk = torch.tensor([0, 40], dtype=torch.int32)
    varlen = flashcpp.attention_varlen(q[0], k[0], v[0], cu, cuk, 17, 40, causal=True,
                                       q_descale=dq[:1], k_descale=dk[:1], v_descale=dv,
                                       fp8_fast_accum=True)
    assert torch.equal(varlen, want[0])
    qb = torch.zeros(1, 4, 2, 64, dtype=torch.bfloat16)
    for call in (flashcpp.attention, fa.attention):
        with pytest.raises(flashcpp.Error, match="fp8_fast_accum: set, but q is bf16"):
            call(qb, qb, qb, fp8_fast_accum=True)
