"""Forward through NumPy on the CPU backends, against the float64 NumPy oracle in _reference.py."""

import numpy as np
import pytest

import flashcpp
import _reference as ref

# Fixed bounds per dtype (the contract's CPU criterion). Inputs are N(0, 1), so |out| <= ~4.
# fp32: fp32 accumulation over <= ~1000 keys drifts ~1e-6 relative; 2e-5 leaves room for the
#       online-softmax rescaling and the exp of the tiled kernel.
# fp16: the output is rounded to fp16 (half-ulp 2^-11 relative, ~2e-3 absolute at |out| = 4),
#       and P is rounded before the P @ V product in a FlashAttention kernel: 2^-9 * (1 + |ref|).
# lse is float32 for every input dtype and the oracle sees the same (rounded) inputs.
OUT_TOL = {np.float32: 2e-5, np.float16: 2.0**-9}
LSE_TOL = 5e-5

BACKENDS = ["cpu", "cpu_reference"]


def make(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def assert_out_close(actual, expected, dtype):
    bound = OUT_TOL[dtype] * (1.0 + np.abs(expected).max(initial=0.0))
    err = np.abs(actual.astype(np.float64) - expected).max(initial=0.0)
    assert err <= bound, f"max |out - ref| = {err:.3g} > {bound:.3g}"


def assert_lse_close(actual, expected):
    assert actual.dtype == np.float32
    finite = np.isfinite(expected)
    np.testing.assert_array_equal(np.isfinite(actual), finite)
    assert np.all(actual[~finite] == -np.inf)
    err = np.abs(actual[finite] - expected[finite]).max(initial=0.0)
    assert err <= LSE_TOL * (1.0 + np.abs(expected[finite]).max(initial=0.0)), f"lse err {err:.3g}"


CASES = [
    # (B, Nq, Nk, Hq, Hkv, D, Dv)
    (1, 1, 1, 1, 1, 32, 32),
    (2, 17, 17, 4, 4, 64, 64),
    (1, 113, 203, 4, 2, 64, 64),  # GQA, Nk > Nq
    (2, 203, 113, 3, 1, 32, 32),  # MQA, Nq > Nk (causal rows without keys)
    (1, 64, 80, 2, 2, 128, 64),  # Dv != D
]
MASKS = [
    dict(causal=False),
    dict(causal=True),
    dict(window=(16, 4)),
    dict(causal=True, window=(7, -1)),
    dict(window=(-1, 0)),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("mask", MASKS, ids=lambda m: "-".join(f"{k}{v}" for k, v in m.items()))
def test_forward_matches_reference(rng, backend, dtype, case, mask):
    b, nq, nk, hq, hkv, d, dv = case
    q, k, v = make(rng, (b, nq, hq, d), dtype), make(rng, (b, nk, hkv, d), dtype), make(
        rng, (b, nk, hkv, dv), dtype)
    out, lse = flashcpp.attention(q, k, v, return_lse=True, backend=backend, **mask)
    assert out.shape == (b, nq, hq, dv) and out.dtype == dtype
    assert lse.shape == (b, hq, nq)
    expected_out, expected_lse = ref.forward(q, k, v, **mask)
    assert_out_close(out, expected_out, dtype)
    assert_lse_close(lse, expected_lse)
    assert flashcpp.last_run_info().backend == backend


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("softcap", [0.5, 5.0])
def test_softcap_and_scale(rng, dtype, softcap):
    q, k, v = (make(rng, (2, 37, 4, 64), dtype) for _ in range(3))
    out, lse = flashcpp.attention(q, k, v, softcap=softcap, softmax_scale=0.3, causal=True,
                                  return_lse=True)
    expected_out, expected_lse = ref.forward(q, k, v, causal=True, softcap=softcap, scale=0.3)
    assert_out_close(out, expected_out, dtype)
    assert_lse_close(lse, expected_lse)


def test_strided_bhsd_views_need_no_copy(rng):
    # [B, H, N, D] memory seen as [B, N, H, D]: the last dim stays contiguous, nothing is copied.
    q_bhsd, k_bhsd, v_bhsd = (make(rng, (2, 4, 50, 64), np.float32) for _ in range(3))
    q, k, v = (t.transpose(0, 2, 1, 3) for t in (q_bhsd, k_bhsd, v_bhsd))
    assert not q.flags.c_contiguous
    out = flashcpp.attention(q, k, v, causal=True)
    assert_out_close(out, ref.forward(q, k, v, causal=True)[0], np.float32)
    # A strided output works too.
    out_bhsd = np.empty((2, 4, 50, 64), np.float32)
    flashcpp.attention(q, k, v, causal=True, out=out_bhsd.transpose(0, 2, 1, 3))
    np.testing.assert_array_equal(out_bhsd.transpose(0, 2, 1, 3), out)


def test_rows_without_keys_are_zero_with_minus_inf_lse(rng):
    q = make(rng, (1, 8, 2, 32), np.float32)
    k, v = make(rng, (1, 3, 2, 32), np.float32), make(rng, (1, 3, 2, 32), np.float32)
    # causal, bottom-right: query i sees keys j <= i - 5, so rows 0..4 see nothing.
    out, lse = flashcpp.attention(q, k, v, causal=True, return_lse=True)
    assert np.all(out[:, :5] == 0) and np.all(np.isneginf(lse[:, :, :5]))
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(lse[:, :, 5:]))


@pytest.mark.parametrize("shape", [(0, 16, 2, 32), (2, 0, 2, 32)])
def test_empty_problems_do_nothing(rng, shape):
    q = np.zeros(shape, np.float32)
    k = v = make(rng, (shape[0], 16, 2, 32), np.float32)
    out, lse = flashcpp.attention(q, k, v, return_lse=True)
    assert out.shape == shape and lse.shape == (shape[0], 2, shape[1])


def test_preallocated_outputs_are_written_in_place(rng):
    q, k, v = (make(rng, (1, 20, 2, 32), np.float32) for _ in range(3))
    out = np.full((1, 20, 2, 32), np.nan, np.float32)
    lse = np.full((1, 2, 20), np.nan, np.float32)
    result = flashcpp.attention(q, k, v, out=out, lse_out=lse, return_lse=True)
    assert result[0] is out and result[1] is lse
    expected_out, expected_lse = ref.forward(q, k, v)
    assert_out_close(out, expected_out, np.float32)
    assert_lse_close(lse, expected_lse)


def test_forward_is_bitwise_deterministic(rng):
    q, k, v = (make(rng, (2, 129, 4, 64), np.float32) for _ in range(3))
    first = flashcpp.attention(q, k, v, causal=True)
    for _ in range(3):
        np.testing.assert_array_equal(flashcpp.attention(q, k, v, causal=True), first)


def test_run_info_and_backend_selection(rng):
    q = make(rng, (1, 4, 1, 32), np.float32)
    assert flashcpp.select_backend(q) == "cpu"
    assert flashcpp.select_backend(q, backend="cpu_reference") == "cpu_reference"
    flashcpp.attention(q, q, q, backend="cpu_reference")
    info = flashcpp.last_run_info()
    assert isinstance(info, flashcpp.RunInfo)
    assert info.backend == "cpu_reference" and info.kernel and info.num_splits >= 1
    flashcpp.attention(q, q, q)
    assert flashcpp.last_run_info().backend == "cpu"
    assert flashcpp.cuda_available() in (True, False)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("mask", [dict(), dict(causal=True), dict(window=(5, 2), softcap=3.0)],
                         ids=["full", "causal", "window-softcap"])
def test_varlen_matches_per_sequence_reference(rng, dtype, mask):
    hq, hkv, d = 4, 2, 64
    lengths_q = [5, 0, 17, 1, 40]
    lengths_k = [9, 3, 17, 0, 33]
    qs = [make(rng, (n, hq, d), dtype) for n in lengths_q]
    ks = [make(rng, (n, hkv, d), dtype) for n in lengths_k]
    vs = [make(rng, (n, hkv, d), dtype) for n in lengths_k]
    q, cu_q = ref.pack(qs)
    k, cu_k = ref.pack(ks)
    v, _ = ref.pack(vs)
    out, lse = flashcpp.attention_varlen(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k),
                                         return_lse=True, **mask)
    assert out.shape == q.shape and lse.shape == (hq, q.shape[0])
    for i, (sq, sk, sv) in enumerate(zip(qs, ks, vs)):
        rows = slice(cu_q[i], cu_q[i + 1])
        expected_out, expected_lse = ref.forward(sq[None], sk[None], sv[None], **mask)
        assert_out_close(out[rows], expected_out[0], dtype)
        assert_lse_close(lse[:, rows], expected_lse[0])
