"""Backward through NumPy: the analytic float64 oracle is first checked against finite
differences, then the CPU backends are checked against it."""

import numpy as np
import pytest

import flashcpp
import _reference as ref

# Gradients sum over keys and queries, so their fp32 error grows with N; the CPU backends
# accumulate in fp32: 1e-4 * (1 + max|ref|) holds with margin for N <= ~200. fp16 gradients
# are rounded to fp16 at the end and dS is formed from fp16-rounded P and dP: 2^-8.
GRAD_TOL = {np.float32: 1e-4, np.float16: 2.0**-8}


def make(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def assert_grad_close(actual, expected, dtype, name):
    assert actual.shape == expected.shape and actual.dtype == dtype, name
    bound = GRAD_TOL[dtype] * (1.0 + np.abs(expected).max(initial=0.0))
    err = np.abs(actual.astype(np.float64) - expected).max(initial=0.0)
    assert err <= bound, f"{name}: max err {err:.3g} > {bound:.3g}"


@pytest.mark.parametrize("options", [dict(), dict(causal=True, window=(3, -1)),
                                     dict(softcap=1.5, window=(2, 2))],
                         ids=["full", "causal-window", "softcap-window"])
def test_oracle_backward_matches_finite_differences(rng, options):
    q, k = make(rng, (1, 5, 2, 8)).astype(np.float64), make(rng, (1, 7, 1, 8)).astype(np.float64)
    v, dout = make(rng, (1, 7, 1, 8)).astype(np.float64), make(rng, (1, 5, 2, 8)).astype(np.float64)
    dq, dk, dv = ref.backward(dout, q, k, v, **options)

    def loss():
        return float((ref.forward(q, k, v, **options)[0] * dout).sum())

    eps = 1e-6
    for tensor, grad in ((q, dq), (k, dk), (v, dv)):
        numeric = np.zeros_like(tensor)
        for index in np.ndindex(tensor.shape):
            saved = tensor[index]
            tensor[index] = saved + eps
            plus = loss()
            tensor[index] = saved - eps
            minus = loss()
            tensor[index] = saved
            numeric[index] = (plus - minus) / (2 * eps)
        np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-7)


CASES = [
    # (B, Nq, Nk, Hq, Hkv, D)
    (1, 1, 1, 1, 1, 32),
    (2, 17, 17, 4, 4, 64),
    (1, 113, 203, 4, 2, 64),
    (1, 203, 113, 3, 1, 32),
]
OPTIONS = [dict(), dict(causal=True), dict(window=(9, 3)), dict(causal=True, softcap=2.0)]


@pytest.mark.parametrize("backend", ["cpu", "cpu_reference"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("options", OPTIONS, ids=["full", "causal", "window", "causal-softcap"])
def test_backward_matches_oracle(rng, backend, dtype, case, options):
    b, nq, nk, hq, hkv, d = case
    q, k, v = make(rng, (b, nq, hq, d), dtype), make(rng, (b, nk, hkv, d), dtype), make(
        rng, (b, nk, hkv, d), dtype)
    dout = make(rng, (b, nq, hq, d), dtype)
    out, lse = flashcpp.attention(q, k, v, return_lse=True, backend=backend, **options)
    dq, dk, dv = flashcpp.attention_backward(dout, q, k, v, out, lse, backend=backend, **options)
    assert flashcpp.last_run_info().backend == backend
    expected = ref.backward(dout, q, k, v, **options)
    for name, actual, want in zip(("dq", "dk", "dv"), (dq, dk, dv), expected):
        assert_grad_close(actual, want, dtype, name)


def test_backward_deterministic_flag_gives_identical_gradients(rng):
    q, k, v, dout = (make(rng, (2, 70, 4, 64)) for _ in range(4))
    out, lse = flashcpp.attention(q, k, v, causal=True, return_lse=True)
    first = flashcpp.attention_backward(dout, q, k, v, out, lse, causal=True, deterministic=True)
    again = flashcpp.attention_backward(dout, q, k, v, out, lse, causal=True, deterministic=True)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)


def test_varlen_backward_matches_per_sequence_oracle(rng):
    hq, hkv, d = 4, 2, 32
    lengths_q, lengths_k = [6, 0, 31, 2], [6, 4, 20, 0]
    qs = [make(rng, (n, hq, d)) for n in lengths_q]
    ks = [make(rng, (n, hkv, d)) for n in lengths_k]
    vs = [make(rng, (n, hkv, d)) for n in lengths_k]
    douts = [make(rng, (n, hq, d)) for n in lengths_q]
    q, cu_q = ref.pack(qs)
    k, cu_k = ref.pack(ks)
    v, _ = ref.pack(vs)
    dout, _ = ref.pack(douts)
    args = (cu_q, cu_k, max(lengths_q), max(lengths_k))
    out, lse = flashcpp.attention_varlen(q, k, v, *args, causal=True, return_lse=True)
    dq, dk, dv = flashcpp.attention_varlen_backward(dout, q, k, v, out, lse, *args, causal=True)
    for i in range(len(lengths_q)):
        rq, rk = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        want = ref.backward(douts[i][None], qs[i][None], ks[i][None], vs[i][None], causal=True)
        assert_grad_close(dq[rq], want[0][0], np.float32, f"dq[{i}]")
        assert_grad_close(dk[rk], want[1][0], np.float32, f"dk[{i}]")
        assert_grad_close(dv[rk], want[2][0], np.float32, f"dv[{i}]")
