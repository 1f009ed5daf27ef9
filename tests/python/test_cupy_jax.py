"""Forward on the GPU through CuPy and JAX arrays (DLPack), against the float64 NumPy oracle.

Both frameworks are on the GPU machine's image; each test skips with a reason where its
framework or a GPU is missing.
"""

import numpy as np
import pytest

import flashcpp
import _reference as ref

# fp16 output rounding (2^-11 relative) plus P rounded to fp16 before P @ V: 2^-9 * (1 + |ref|).
OUT_TOL = 2.0**-9
LSE_TOL = 1e-3  # fp32 statistics from fp16 scores, as in the C++ GPU suite

needs_gpu = pytest.mark.skipif(not flashcpp.cuda_available(), reason="no CUDA GPU")


def inputs(seed=0, b=2, nq=113, nk=203, hq=4, hkv=2, d=64):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float16)
            for s in ((b, nq, hq, d), (b, nk, hkv, d), (b, nk, hkv, d))]


def check(out, lse, q, k, v, causal):
    expected_out, expected_lse = ref.forward(q, k, v, causal=causal)
    err = np.abs(np.asarray(out, dtype=np.float64) - expected_out).max()
    assert err <= OUT_TOL * (1.0 + np.abs(expected_out).max()), f"out err {err:.3g}"
    lse = np.asarray(lse, dtype=np.float64)
    finite = np.isfinite(expected_lse)
    np.testing.assert_array_equal(np.isfinite(lse), finite)
    assert np.abs(lse[finite] - expected_lse[finite]).max() <= LSE_TOL


@needs_gpu
@pytest.mark.parametrize("causal", [False, True])
def test_cupy_forward(causal):
    cp = pytest.importorskip("cupy")
    q, k, v = inputs()
    qd, kd, vd = (cp.asarray(x) for x in (q, k, v))
    out, lse = flashcpp.attention(qd, kd, vd, causal=causal, return_lse=True)
    assert isinstance(out, cp.ndarray) and out.dtype == cp.float16 and out.shape == q.shape
    check(cp.asnumpy(out), cp.asnumpy(lse), q, k, v, causal)
    assert flashcpp.last_run_info().backend.startswith("cuda")


@needs_gpu
@pytest.mark.parametrize("causal", [False, True])
def test_jax_forward(causal):
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    if not any(dev.platform == "gpu" for dev in jax.devices()):
        pytest.skip("JAX sees no GPU")
    q, k, v = inputs(seed=1)
    qd, kd, vd = (jnp.asarray(x) for x in (q, k, v))
    for x in (qd, kd, vd):  # JAX dispatches asynchronously on its own streams
        x.block_until_ready()
    out, lse = flashcpp.attention(qd, kd, vd, causal=causal, return_lse=True)
    out.block_until_ready()
    check(np.asarray(out), np.asarray(lse), q, k, v, causal)
    assert flashcpp.last_run_info().backend.startswith("cuda")
