"""flashcpp.torch on the CPU backend: custom ops against PyTorch's math SDPA in float64,
autograd, torch.compile(fullgraph=True), opcheck. Skipped without PyTorch."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
F = torch.nn.functional

import flashcpp  # noqa: E402
import flashcpp.torch as fa  # noqa: E402
import _reference as ref  # noqa: E402

from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402


def math_sdpa(q, k, v, **kwargs):
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)


def rand(*shape, dtype=torch.float32, grad=False, seed=None):
    g = torch.Generator().manual_seed(seed if seed is not None else sum(shape))
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype).requires_grad_(grad)


def max_err(a, b):
    return (a.double() - b.double()).abs().max().item()


def assert_within_criterion(ours, theirs, exact, dtype, what):
    """The contract: error vs float64 no larger than 2x PyTorch math's same-dtype error, plus
    the dtype's rounding noise at the magnitude of the result. fp16/bf16: one unit roundoff
    (the final rounding dominates). fp32: PyTorch's CPU math is nearly exact at these sizes
    (its error can be ~1 ulp), while a tiled kernel's fp32 sums over <= 200 keys with online
    rescaling drift by tens of ulps: 32 units of roundoff (~1e-5 at |x| = 4)."""
    noise = {torch.float32: 32 * 2.0**-24, torch.float16: 2.0**-11,
             torch.bfloat16: 2.0**-8}[dtype]
    bound = 2 * max_err(theirs, exact) + noise * (1 + exact.abs().max().item())
    err = max_err(ours, exact)
    assert err <= bound, f"{what}: flashcpp error {err:.3g} > bound {bound:.3g}"


SHAPES = [  # (B, H, Hkv, Nq, Nk, D)
    (1, 1, 1, 1, 1, 32),
    (2, 4, 4, 17, 17, 64),
    (1, 4, 2, 113, 203, 64),
    (2, 6, 1, 64, 64, 128),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("is_causal", [False, True])
def test_sdpa_forward_matches_math_sdpa(dtype, shape, is_causal):
    b, h, hkv, nq, nk, d = shape
    if is_causal and nq != nk:
        pytest.skip("PyTorch's is_causal is top-left aligned for Nq != Nk")
    q, k, v = rand(b, h, nq, d, dtype=dtype), rand(b, hkv, nk, d, dtype=dtype), rand(
        b, hkv, nk, d, dtype=dtype, seed=7)
    gqa = dict(enable_gqa=h != hkv)
    ours = fa.sdpa(q, k, v, is_causal=is_causal, **gqa)
    assert ours.shape == (b, h, nq, d) and ours.dtype == dtype
    exact = math_sdpa(q.double(), k.double(), v.double(), is_causal=is_causal, **gqa)
    theirs = math_sdpa(q, k, v, is_causal=is_causal, **gqa)
    assert_within_criterion(ours, theirs, exact, dtype, "out")
    assert flashcpp.last_run_info().backend == "cpu"


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("is_causal", [False, True])
def test_sdpa_gradients_match_float64_math(shape, is_causal):
    b, h, hkv, nq, nk, d = shape
    if is_causal and nq != nk:
        pytest.skip("PyTorch's is_causal is top-left aligned for Nq != Nk")
    gqa = dict(enable_gqa=h != hkv)
    inputs = [rand(b, h, nq, d, grad=True), rand(b, hkv, nk, d, grad=True),
              rand(b, hkv, nk, d, grad=True, seed=3)]
    dout = rand(b, h, nq, d, seed=11)
    grads_ours = torch.autograd.grad(fa.sdpa(*inputs, is_causal=is_causal, scale=0.2, **gqa),
                                     inputs, dout)
    grads_theirs = torch.autograd.grad(
        math_sdpa(*inputs, is_causal=is_causal, scale=0.2, **gqa), inputs, dout)
    exact_inputs = [t.detach().double().requires_grad_() for t in inputs]
    grads_exact = torch.autograd.grad(
        math_sdpa(*exact_inputs, is_causal=is_causal, scale=0.2, **gqa), exact_inputs,
        dout.double())
    for name, ours, theirs, exact in zip("qkv", grads_ours, grads_theirs, grads_exact):
        assert ours.shape == exact.shape
        assert_within_criterion(ours, theirs, exact, torch.float32, f"d{name}")


@pytest.mark.parametrize("options", [dict(causal=True), dict(window=(5, 3)),
                                     dict(causal=True, softcap=2.0, softmax_scale=0.5)],
                         ids=["causal", "window", "softcap"])
def test_attention_forward_and_backward_match_numpy_oracle(options):
    # Bottom-right causal with Nq != Nk, windows and softcap: beyond what SDPA expresses.
    q, k, v = rand(2, 23, 4, 32, grad=True), rand(2, 41, 2, 32, grad=True), rand(
        2, 41, 2, 32, grad=True, seed=5)
    out, lse = fa.attention(q, k, v, return_lse=True, **options)
    dout = rand(2, 23, 4, 32, seed=9)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    np_options = {("scale" if key == "softmax_scale" else key): value
                  for key, value in options.items()}
    arrays = [t.detach().numpy() for t in (q, k, v)]
    exact_out, exact_lse = ref.forward(*arrays, **np_options)
    np.testing.assert_allclose(out.detach().numpy(), exact_out, atol=2e-5)
    np.testing.assert_allclose(lse.numpy(), exact_lse, atol=5e-5)
    assert not lse.requires_grad
    for ours, exact in zip(grads, ref.backward(dout.numpy(), *arrays, **np_options)):
        np.testing.assert_allclose(ours.numpy(), exact, atol=1e-4)


def test_varlen_autograd_matches_per_sequence():
    lengths = [7, 0, 19, 3]
    cu = torch.tensor([0] + list(np.cumsum(lengths)), dtype=torch.int32)
    total = int(cu[-1])
    q, k, v = (rand(total, 4, 32, grad=True, seed=s) for s in (1, 2, 3))
    out = fa.attention_varlen(q, k, v, cu, cu, max(lengths), max(lengths), causal=True)
    dout = rand(total, 4, 32, seed=4)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    for i in range(len(lengths)):
        rows = slice(int(cu[i]), int(cu[i + 1]))
        seq = [t.detach()[rows].unsqueeze(0).numpy() for t in (q, k, v)]
        np.testing.assert_allclose(out.detach()[rows].numpy(),
                                   ref.forward(*seq, causal=True)[0][0], atol=2e-5)
        expected = ref.backward(dout[rows].unsqueeze(0).numpy(), *seq, causal=True)
        for ours, exact in zip(grads, expected):
            np.testing.assert_allclose(ours[rows].numpy(), exact[0], atol=1e-4)


def test_generic_api_routes_grad_tensors_through_autograd():
    q, k, v = (rand(1, 9, 2, 32, grad=True, seed=s) for s in (1, 2, 3))
    out = flashcpp.attention(q, k, v, causal=True)
    assert out.requires_grad
    out.sum().backward()
    assert q.grad is not None and k.grad is not None and v.grad is not None
    with torch.no_grad():  # no autograd: the plain path, outputs from torch.empty
        plain = flashcpp.attention(q, k, v, causal=True)
    assert isinstance(plain, torch.Tensor) and not plain.requires_grad
    torch.testing.assert_close(plain, out.detach(), rtol=0, atol=0)


def test_generic_backward_on_torch_tensors():
    q, k, v = (rand(1, 9, 2, 32, seed=s) for s in (1, 2, 3))
    out, lse = flashcpp.attention(q, k, v, return_lse=True, backend="cpu_reference")
    dq, dk, dv = flashcpp.attention_backward(torch.ones_like(out), q, k, v, out, lse,
                                             backend="cpu_reference")
    assert all(isinstance(g, torch.Tensor) and g.shape == t.shape
               for g, t in ((dq, q), (dk, k), (dv, v)))


def test_non_contiguous_last_dim_is_copied_not_refused():
    base = rand(1, 2, 16, 64)  # [B, H, D, N] memory: the head dim is strided
    q = base.permute(0, 3, 1, 2)  # [B, N, H, D] with stride(-1) != 1
    assert q.stride(-1) != 1
    out = fa.attention(q, q, q)
    expected = fa.attention(q.contiguous(), q.contiguous(), q.contiguous())
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_sdpa_rejects_what_it_does_not_do():
    q = rand(1, 2, 8, 32)
    with pytest.raises(ValueError, match="attn_mask is not supported"):
        fa.sdpa(q, q, q, attn_mask=torch.ones(8, 8, dtype=torch.bool))
    with pytest.raises(ValueError, match="dropout_p must be 0"):
        fa.sdpa(q, q, q, dropout_p=0.1)
    with pytest.raises(ValueError, match="top-left aligned in PyTorch but bottom-right"):
        fa.sdpa(q, rand(1, 2, 12, 32), rand(1, 2, 12, 32), is_causal=True)
    with pytest.raises(ValueError, match="enable_gqa=True"):
        fa.sdpa(rand(1, 4, 8, 32), q, q)
    with pytest.raises(ValueError, match="q: expected 4 dimensions"):
        fa.attention(q[0], q[0], q[0])
    with pytest.raises(TypeError, match="q: dtype float64 is not supported"):
        fa.attention(q.double(), q.double(), q.double())


def test_rank3_sdpa():
    q, k, v = rand(2, 8, 32), rand(2, 8, 32, seed=1), rand(2, 8, 32, seed=2)
    torch.testing.assert_close(fa.sdpa(q, k, v, is_causal=True),
                               math_sdpa(q, k, v, is_causal=True), atol=2e-6, rtol=0)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph(backend):
    torch._dynamo.reset()

    def block(x, wq, wk, wv):
        b, n, _ = x.shape
        q = (x @ wq).view(b, n, 4, 32).transpose(1, 2)
        k = (x @ wk).view(b, n, 2, 32).transpose(1, 2)
        v = (x @ wv).view(b, n, 2, 32).transpose(1, 2)
        o = fa.sdpa(q, k, v, is_causal=True, enable_gqa=True)
        return o.transpose(1, 2).reshape(b, n, 128).sum()

    x = rand(2, 33, 64, grad=True)
    weights = [rand(64, 128, grad=True, seed=1), rand(64, 64, grad=True, seed=2),
               rand(64, 64, grad=True, seed=3)]
    compiled = torch.compile(block, fullgraph=True, backend=backend)  # raises on a graph break
    loss = compiled(x, *weights)
    grads = torch.autograd.grad(loss, [x, *weights])
    loss_eager = block(x, *weights)
    grads_eager = torch.autograd.grad(loss_eager, [x, *weights])
    torch.testing.assert_close(loss, loss_eager, atol=1e-4, rtol=1e-5)
    for g, e in zip(grads, grads_eager):
        torch.testing.assert_close(g, e, atol=1e-4, rtol=1e-4)


def test_generic_api_compiles_without_graph_break():
    torch._dynamo.reset()

    def f(q, k, v):
        return flashcpp.attention(q, k, v, causal=True, window=(4, -1)) * 2

    q, k, v = (rand(1, 12, 2, 32, grad=True, seed=s) for s in (1, 2, 3))
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, v), f(q, k, v), atol=0, rtol=0)
    with torch.no_grad():  # inference under compile takes the custom op too
        torch.testing.assert_close(compiled(q, k, v), f(q, k, v), atol=0, rtol=0)


def test_opcheck():
    q, k, v = (rand(1, 9, 2, 32, grad=True, seed=s) for s in (1, 2, 3))
    torch.library.opcheck(torch.ops.flashcpp.attention_fwd.default,
                          (q, k, v, True, None, -1, -1, 0.0, "auto", False))
    out, lse = fa.attention(q, k, v, causal=True, return_lse=True)
    torch.library.opcheck(torch.ops.flashcpp.attention_bwd.default,
                          (torch.ones_like(out), q.detach(), k.detach(), v.detach(),
                           out.detach(), lse, True, None, -1, -1, 0.0, "auto", False))
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    torch.library.opcheck(torch.ops.flashcpp.attention_varlen_fwd.default,
                          (q[0], k[0], v[0], cu, cu, 5, 5, True, None, -1, -1, 0.0, "auto",
                           False))
