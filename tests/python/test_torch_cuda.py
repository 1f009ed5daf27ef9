"""flashcpp on CUDA through PyTorch: forward vs SDPA with the contract's criterion, CUDA graph
capture, torch.compile, streams, and the backward (or the error naming what is missing).
Skipped without a GPU and a CUDA build of flashcpp."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
F = torch.nn.functional

import flashcpp  # noqa: E402
import flashcpp.torch as fa  # noqa: E402

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and flashcpp.cuda_available()),
    reason="needs a CUDA GPU and flashcpp built with CUDA (FLASHCPP_CUDA=1)")

from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def reference(q, k, v, causal=False, window=(-1, -1), softcap=0.0, scale=None):
    """float64 attention in [B, N, H, D] with flashcpp's bottom-right masks; returns out, lse."""
    q, k, v = (t.double().transpose(1, 2) for t in (q, k, v))  # [B, H, N, D]
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    nq, nk = q.shape[2], k.shape[2]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = scale * q @ k.transpose(-1, -2)
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(nq, device=q.device)[:, None] + (nk - nq)
    j = torch.arange(nk, device=q.device)[None, :]
    left, right = window
    right = 0 if causal else right
    visible = torch.ones(nq, nk, dtype=torch.bool, device=q.device)
    if left >= 0:
        visible &= j >= i - left
    if right >= 0:
        visible &= j <= i + right
    s = s.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    return (p @ v).transpose(1, 2), lse


def math_same_dtype(q, k, v, causal):
    """PyTorch's math path in q's dtype: the yardstick of the contract's criterion."""
    gqa = q.shape[2] != k.shape[2]
    with sdpa_kernel(SDPBackend.MATH):
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                             v.transpose(1, 2), is_causal=causal,
                                             enable_gqa=gqa)
    return out.transpose(1, 2)


def check(ours, theirs, exact, dtype, what):
    err_ours = (ours.double() - exact).abs().max().item()
    err_theirs = (theirs.double() - exact).abs().max().item()
    bound = 2 * err_theirs + UNIT_ROUNDOFF[dtype] * max(1.0, exact.abs().max().item())
    assert err_ours <= bound, f"{what}: error {err_ours:.3g} > {bound:.3g} (math {err_theirs:.3g})"


SHAPES = [  # (B, Nq, Nk, Hq, Hkv, D)
    (1, 1, 1, 1, 1, 64),
    (2, 128, 128, 8, 8, 64),
    (1, 113, 203, 8, 2, 128),
    (2, 256, 256, 4, 1, 128),
    (1, 1000, 1000, 2, 2, 64),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True])
def test_forward_matches_reference_within_criterion(dtype, shape, causal):
    b, nq, nk, hq, hkv, d = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, nq, hq, d, device="cuda", generator=g).to(dtype)
    k = torch.randn(b, nk, hkv, d, device="cuda", generator=g).to(dtype)
    v = torch.randn(b, nk, hkv, d, device="cuda", generator=g).to(dtype)
    out, lse = fa.attention(q, k, v, causal=causal, return_lse=True)
    info = flashcpp.last_run_info()
    assert info.backend.startswith("cuda"), info
    exact_out, exact_lse = reference(q, k, v, causal=causal)
    if nq == nk or not causal:  # the math yardstick exists where SDPA's mask is the same
        check(out, math_same_dtype(q, k, v, causal), exact_out, dtype, "out")
    else:
        bound = 4 * UNIT_ROUNDOFF[dtype] * max(1.0, exact_out.abs().max().item())
        assert (out.double() - exact_out).abs().max().item() <= bound
    finite = torch.isfinite(exact_lse)
    torch.testing.assert_close(lse[finite].double(), exact_lse[finite], atol=1e-3, rtol=1e-4)


def test_generic_api_with_explicit_stream_and_bhsd_views():
    q = torch.randn(2, 8, 64, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = flashcpp.attention(q, q, q, causal=True)  # picks up the current (side) stream
    torch.cuda.current_stream().wait_stream(side)
    explicit = flashcpp.attention(q, q, q, causal=True, stream=torch.cuda.current_stream())
    torch.testing.assert_close(out, explicit, atol=0, rtol=0)  # forward is deterministic


def test_cuda_graph_capture_and_replay():
    shape = (2, 256, 8, 64)
    static = [torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    fa.attention(*static, causal=True)  # warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = fa.attention(*static, causal=True)
    fresh = [torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    for dst, src in zip(static, fresh):
        dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(static_out, fa.attention(*fresh, causal=True), atol=0, rtol=0)


def test_torch_compile_fullgraph_inductor():
    torch._dynamo.reset()

    def f(q, k, v):
        return fa.sdpa(q * 0.5, k, v, is_causal=True, enable_gqa=True).float().sum(-1)

    q = torch.randn(2, 8, 128, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 2, 128, 64, device="cuda", dtype=torch.bfloat16)
    compiled = torch.compile(f, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, k), f(q, k, k), atol=1e-2, rtol=1e-2)


def test_backward_matches_reference_or_names_what_is_missing():
    q, k, v = (torch.randn(1, 77, 4, 64, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    out = fa.attention(q, k, v, causal=True)
    dout = torch.randn_like(out)
    try:
        grads = torch.autograd.grad(out, (q, k, v), dout)
    except flashcpp.Error as error:  # a ValueError carrying the C++ message
        assert "backward" in str(error).lower(), str(error)
        pytest.xfail(f"GPU backward not available: {error}")
    exact = [t.detach().double().requires_grad_() for t in (q, k, v)]
    exact_out, _ = reference(*exact, causal=True)
    exact_grads = torch.autograd.grad(exact_out, exact, dout.double())
    for name, ours, want in zip("qkv", grads, exact_grads):
        bound = 8 * UNIT_ROUNDOFF[torch.bfloat16] * max(1.0, want.abs().max().item())
        assert (ours.double() - want).abs().max().item() <= bound, f"d{name}"


def test_wrong_dtype_on_cuda_is_a_clear_error():
    q = torch.randn(1, 8, 2, 64, device="cuda")
    with pytest.raises(ValueError, match="fp32 is not supported by the cuda backend"):
        fa.attention(q, q, q)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_matches_the_reference_per_sequence(causal):
    # Packed sequences (one empty) through the plain API and the custom op; forces the
    # varlen workspace query on the CUDA path.
    lengths_q, lengths_k = [37, 0, 130], [50, 9, 130]
    hq, hkv, d, dtype = 4, 2, 64, torch.bfloat16
    cu_q = torch.tensor([0, 37, 37, 167], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 50, 59, 189], dtype=torch.int32, device="cuda")
    q = torch.randn(sum(lengths_q), hq, d, device="cuda", dtype=dtype)
    k = torch.randn(sum(lengths_k), hkv, d, device="cuda", dtype=dtype)
    v = torch.randn(sum(lengths_k), hkv, d, device="cuda", dtype=dtype)
    plain = flashcpp.attention_varlen(q, k, v, cu_q, cu_k, 130, 130, causal=causal)
    op = fa.attention_varlen(q, k, v, cu_q, cu_k, 130, 130, causal=causal)
    rq = rk = 0
    for nq, nk in zip(lengths_q, lengths_k):
        if nq:
            exact, _ = reference(q[None, rq:rq + nq], k[None, rk:rk + nk], v[None, rk:rk + nk],
                                 causal=causal)
            # bf16 output rounding plus P rounded to bf16 before P @ V: a few units of roundoff
            bound = 8 * UNIT_ROUNDOFF[dtype] * max(1.0, exact.abs().max().item())
            for ours in (plain, op):
                err = (ours[None, rq:rq + nq].double() - exact).abs().max().item()
                assert err <= bound, f"sequence ({nq}, {nk}): {err:.3g} > {bound:.3g}"
        rq, rk = rq + nq, rk + nk


@pytest.mark.parametrize("causal", [False, True])
def test_mla_prefill_head_dims_run_on_sm90a(causal):
    # D 192 / Dv 128 (DeepSeek-style MLA prefill): only the sm90a pair kernels take D != Dv.
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("D != Dv runs on the sm90a kernels only (a Hopper GPU)")
    dtype = torch.bfloat16
    q, k = (torch.randn(1, 300, h, 192, device="cuda", dtype=dtype, requires_grad=True)
            for h in (8, 2))
    v = torch.randn(1, 300, 2, 128, device="cuda", dtype=dtype, requires_grad=True)
    try:
        out = fa.attention(q, k, v, causal=causal)
    except flashcpp.Error as error:
        if "in this build" in str(error):
            pytest.skip(str(error))
        raise
    assert "hdim192x128" in flashcpp.last_run_info().kernel, flashcpp.last_run_info()
    assert out.shape == (1, 300, 8, 128)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    assert "hdim192x128" in flashcpp.last_run_info().kernel, flashcpp.last_run_info()
    exact = [t.detach().double().requires_grad_() for t in (q, k, v)]
    exact_out, _ = reference(*exact, causal=causal)
    bound = 8 * UNIT_ROUNDOFF[dtype] * max(1.0, exact_out.abs().max().item())
    assert (out.double() - exact_out).abs().max().item() <= bound
    exact_grads = torch.autograd.grad(exact_out, exact, dout.double())
    for name, ours, want in zip("qkv", grads, exact_grads):
        assert ours.shape == want.shape
        bound = 8 * UNIT_ROUNDOFF[dtype] * max(1.0, want.abs().max().item())
        assert (ours.double() - want).abs().max().item() <= bound, f"d{name}"
