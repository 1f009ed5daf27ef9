"""Property-based tests (hypothesis): random shapes, strides, options and dtypes through both CPU
backends against the float64 NumPy oracle of _reference.py. Derandomized, so CI sees the same
examples every run; a failure prints the smallest example hypothesis found."""

import numpy as np
import pytest

import flashcpp
from _reference import backward as reference_backward
from _reference import forward as reference_forward
from _reference import pack

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

SETTINGS = hypothesis.settings(max_examples=60, deadline=None, derandomize=True,
                               suppress_health_check=[hypothesis.HealthCheck.too_slow])

# out and lse tolerance per dtype (inputs are exact in the dtype, the oracle is float64): fp32
# work over at most 40 keys, or the final rounding of out to fp16 (2^-11 relative) plus it.
TOLERANCE = {np.float32: 2e-5, np.float16: 2e-3}


@st.composite
def options(draw):
    window = draw(st.sampled_from([(-1, -1), (0, 0), (3, -1), (-1, 2), (5, 5), (12, 1)]))
    return dict(causal=draw(st.booleans()), window=window,
                softcap=draw(st.sampled_from([0.0, 0.0, 4.0])),
                softmax_scale=draw(st.sampled_from([None, None, 0.3])))


def laid_out(x, layout):
    """x [B, N, H, D] in another memory order with the same values: BHSD, or rows padded."""
    if layout == "bhsd":
        return np.ascontiguousarray(x.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    if layout == "padded":
        wide = np.full(x.shape[:-1] + (x.shape[-1] + 8,), np.nan, dtype=x.dtype)
        wide[..., : x.shape[-1]] = x
        return wide[..., : x.shape[-1]]
    return x


@st.composite
def problems(draw):
    dtype = draw(st.sampled_from([np.float32, np.float16]))
    hkv = draw(st.integers(1, 2))
    hq = hkv * draw(st.integers(1, 2))
    b, nq, nk = draw(st.integers(1, 2)), draw(st.integers(0, 40)), draw(st.integers(0, 40))
    d = draw(st.sampled_from([8, 16, 32]))
    dv = draw(st.sampled_from([d, d, 16]))
    seed = draw(st.integers(0, 2**32 - 1))
    layout = draw(st.sampled_from(["bshd", "bhsd", "padded"]))
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal(shape).astype(dtype) for shape in
               ((b, nq, hq, d), (b, nk, hkv, d), (b, nk, hkv, dv)))
    return dtype, tuple(laid_out(t, layout) for t in (q, k, v)), draw(options())


@pytest.mark.parametrize("backend", ["cpu", "cpu_reference"])
def test_forward_matches_the_oracle(backend):
    @SETTINGS
    @hypothesis.given(problems())
    def check(problem):
        dtype, (q, k, v), opts = problem
        out, lse = flashcpp.attention(q, k, v, return_lse=True, backend=backend, **opts)
        ref, ref_lse = reference_forward(q, k, v, **opts_for_reference(opts))
        tol = TOLERANCE[dtype]
        np.testing.assert_allclose(out.astype(np.float64), ref, rtol=tol, atol=tol)
        np.testing.assert_allclose(lse, ref_lse, rtol=2e-5, atol=2e-5)

    check()


@pytest.mark.parametrize("backend", ["cpu", "cpu_reference"])
def test_backward_matches_the_oracle(backend):
    @SETTINGS
    @hypothesis.given(problems())
    def check(problem):
        dtype, (q, k, v), opts = problem
        hypothesis.assume(dtype == np.float32)  # gradients of fp16 inputs round too coarsely
        out, lse = flashcpp.attention(q, k, v, return_lse=True, backend=backend, **opts)
        dout = np.random.default_rng(0).standard_normal(out.shape).astype(np.float32)
        grads = flashcpp.attention_backward(dout, q, k, v, out, lse, backend=backend, **opts)
        refs = reference_backward(dout, q, k, v, **opts_for_reference(opts))
        for name, grad, ref in zip(("dq", "dk", "dv"), grads, refs):
            scale = max(1.0, float(np.abs(ref).max(initial=0.0)))
            np.testing.assert_allclose(grad, ref, rtol=2e-4, atol=2e-4 * scale, err_msg=name)

    check()


@st.composite
def varlen_problems(draw):
    lengths = draw(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20)), min_size=0,
                            max_size=4))
    tail = draw(st.integers(0, 3))  # rows past the last sequence
    seed = draw(st.integers(0, 2**32 - 1))
    return lengths, tail, seed, draw(options())


@pytest.mark.parametrize("backend", ["cpu", "cpu_reference"])
def test_varlen_matches_the_oracle_per_sequence(backend):
    @SETTINGS
    @hypothesis.given(varlen_problems())
    def check(problem):
        lengths, tail, seed, opts = problem
        rng = np.random.default_rng(seed)
        seqs = [tuple(rng.standard_normal((n, 2, 16)).astype(np.float32) for n in (nq, nk, nk))
                for nq, nk in lengths]
        pad = np.zeros((tail, 2, 16), np.float32)
        q, cu_q = pack([s[0] for s in seqs] + [pad])
        k, cu_k = pack([s[1] for s in seqs] + [pad])
        v, _ = pack([s[2] for s in seqs] + [pad])
        cu_q, cu_k = cu_q[:-1].copy(), cu_k[:-1].copy()  # the padding is no sequence
        max_q = max([n for n, _ in lengths], default=0)
        max_k = max([n for _, n in lengths], default=0)
        out, lse = flashcpp.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, return_lse=True,
                                             backend=backend, **opts)
        for b, (nq, nk) in enumerate(lengths):
            ref, ref_lse = reference_forward(*(t[None] for t in seqs[b]),
                                             **opts_for_reference(opts))
            rows = slice(cu_q[b], cu_q[b] + nq)
            np.testing.assert_allclose(out[rows], ref[0], rtol=2e-5, atol=2e-5)
            np.testing.assert_allclose(lse[:, rows], ref_lse[0], rtol=2e-5, atol=2e-5)
        assert (out[cu_q[-1]:] == 0).all() and (lse[:, cu_q[-1]:] == -np.inf).all()

    check()


def opts_for_reference(opts):
    return dict(causal=opts["causal"], window=opts["window"], softcap=opts["softcap"],
                scale=opts["softmax_scale"])
