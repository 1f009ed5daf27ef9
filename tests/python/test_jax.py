"""flashcpp.jax under jax.jit, jax.grad and jax.vmap (the XLA FFI handlers), against the
float64 NumPy oracle. CPU here (CI installs a CPU jax); the CUDA tests skip without a GPU
that both flashcpp and JAX see. Skipped without JAX."""

import os
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed")
jnp = jax.numpy

import flashcpp  # noqa: E402
import flashcpp.compat  # noqa: E402
import flashcpp.jax as fj  # noqa: E402
import _reference as ref  # noqa: E402

# CI builds flashcpp in the venv that has jax, so the handlers must be there; elsewhere a
# build without them skips (test_missing_handlers_error_names_what_is_missing covers it).
if not fj.available() and not os.environ.get("CI"):
    pytest.skip(fj._VERSION_PROBLEM or "this flashcpp build has no XLA FFI handlers",
                allow_module_level=True)

# Error bounds, relative to 1 + max|oracle|. Inputs are rounded to the dtype first and the
# oracle runs on the rounded values, so what remains is the kernel's own rounding: fp32 as in
# test_numpy_backward.py (1e-4 holds for N <= ~200); fp16/bf16 as there and in
# test_cupy_jax.py: out and gradients rounded to the dtype at the end, P and dP rounded before
# their products (2^-9 / 2^-8 for fp16; bf16 has 3 bits fewer).
TOL = {"float32": (1e-4, 1e-4), "float16": (2.0**-9, 2.0**-8),
       "bfloat16": (2.0**-6, 2.0**-5)}  # (out, gradients)
LSE_TOL = 1e-3


@pytest.fixture(autouse=True)
def _cpu_unless_cuda_test(request):
    """The tests run on JAX's CPU device, except the CUDA ones: where JAX sees a GPU its default
    device is the GPU, and the CPU tests' float32 cases have no CUDA kernel."""
    if request.node.name.startswith("test_cuda_"):
        yield
        return
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def random_case(seed):
    """(B, Nq, Nk, Hq, Hkv, D) drawn from a seeded generator: odd lengths, GQA, MQA."""
    rng = np.random.default_rng(seed)
    hkv = int(rng.integers(1, 3))
    return (int(rng.integers(1, 3)), int(rng.integers(1, 90)), int(rng.integers(1, 130)),
            hkv * int(rng.integers(1, 4)), hkv, int(rng.choice([32, 64, 128])))


def inputs(case, dtype, seed):
    b, nq, nk, hq, hkv, d = case
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(s) for s in ((b, nq, hq, d), (b, nk, hkv, d), (b, nk, hkv, d),
                                               (b, nq, hq, d))]
    # Round to the dtype once: JAX and the oracle see the same values.
    return [np.asarray(jnp.asarray(a, dtype=dtype).astype(jnp.float32)) for a in arrays]


def assert_close(actual, expected, tol, name):
    actual = np.asarray(jnp.asarray(actual).astype(jnp.float32), dtype=np.float64)
    assert actual.shape == expected.shape, name
    err = np.abs(actual - expected).max(initial=0.0)
    bound = tol * (1.0 + np.abs(expected).max(initial=0.0))
    assert err <= bound, f"{name}: max err {err:.3g} > {bound:.3g}"


OPTIONS = [dict(), dict(causal=True), dict(window=(9, 3)), dict(causal=True, softcap=2.0),
           dict(softmax_scale=0.3, window=(-1, 5))]
OPTION_IDS = ["full", "causal", "window", "causal-softcap", "scale-window"]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("options", OPTIONS, ids=OPTION_IDS)
@pytest.mark.parametrize("seed", [1, 2])
def test_jit_forward_and_grad_match_oracle(dtype, options, seed):
    case = random_case(seed + 10 * OPTIONS.index(options))
    q, k, v, dout = inputs(case, dtype, seed)
    qj, kj, vj, doj = (jnp.asarray(x, dtype=dtype) for x in (q, k, v, dout))

    def loss(q, k, v):
        out = fj.attention(q, k, v, **options)
        return (out.astype(jnp.float32) * doj.astype(jnp.float32)).sum()

    out, lse = jax.jit(lambda q, k, v: fj.attention(q, k, v, return_lse=True, **options))(
        qj, kj, vj)
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(qj, kj, vj)

    scale = options.get("softmax_scale")
    oracle = dict(options, scale=scale)
    oracle.pop("softmax_scale", None)
    expected_out, expected_lse = ref.forward(q, k, v, **oracle)
    assert out.dtype == dtype and lse.dtype == jnp.float32
    assert_close(out, expected_out, TOL[dtype][0], f"out {case}")
    lse = np.asarray(lse, dtype=np.float64)
    finite = np.isfinite(expected_lse)
    np.testing.assert_array_equal(np.isfinite(lse), finite)
    assert np.abs(lse[finite] - expected_lse[finite]).max(initial=0.0) <= LSE_TOL
    for name, grad, want in zip(("dq", "dk", "dv"), grads, ref.backward(dout, q, k, v, **oracle)):
        assert grad.dtype == dtype
        assert_close(grad, want, TOL[dtype][1], f"{name} {case}")


def packed_case(seed, dtype):
    """Packed sequences of random lengths (some empty) plus 3 rows past cu_seqlens_q[B]."""
    rng = np.random.default_rng(seed)
    b, hkv = int(rng.integers(1, 4)), int(rng.integers(1, 3))
    hq, d = hkv * int(rng.integers(1, 3)), int(rng.choice([32, 64]))
    lq, lk = rng.integers(0, 60, b), rng.integers(0, 90, b)

    def rows(n, h):
        return np.asarray(jnp.asarray(rng.standard_normal((n, h, d)), dtype=dtype)
                          .astype(jnp.float32))

    q, cu_q = ref.pack([rows(int(n), hq) for n in lq])
    k, cu_k = ref.pack([rows(int(n), hkv) for n in lk])
    v, _ = ref.pack([rows(int(n), hkv) for n in lk])
    q = np.concatenate([q, rows(3, hq)])
    return q, k, v, rows(len(q), hq), cu_q, cu_k, int(lq.max()), int(lk.max())


def varlen_oracle(dout, q, k, v, cu_q, cu_k, options):
    """ref.forward/backward per sequence; rows past cu_q[B] stay out 0, lse -inf, dq 0."""
    out, lse = np.zeros(q.shape), np.full((q.shape[1], q.shape[0]), -np.inf)
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for b in range(len(cu_q) - 1):
        sq, sk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        o, s = ref.forward(q[None, sq], k[None, sk], v[None, sk], **options)
        out[sq], lse[:, sq] = o[0], s[0]
        grads = ref.backward(dout[None, sq], q[None, sq], k[None, sk], v[None, sk], **options)
        dq[sq], dk[sk], dv[sk] = (g[0] for g in grads)
    return out, lse, (dq, dk, dv)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("options", OPTIONS[:4], ids=OPTION_IDS[:4])
def test_jit_varlen_forward_and_grad_match_oracle(dtype, options):
    q, k, v, dout, cu_q, cu_k, max_q, max_k = packed_case(OPTIONS.index(options) + 3, dtype)
    qj, kj, vj, doj = (jnp.asarray(x, dtype=dtype) for x in (q, k, v, dout))

    def run(q, k, v, **extra):
        return fj.attention_varlen(q, k, v, jnp.asarray(cu_q), jnp.asarray(cu_k), max_q, max_k,
                                   **options, **extra)

    out, lse = jax.jit(lambda q, k, v: run(q, k, v, return_lse=True))(qj, kj, vj)
    grads = jax.jit(jax.grad(
        lambda q, k, v: (run(q, k, v).astype(jnp.float32) * doj.astype(jnp.float32)).sum(),
        argnums=(0, 1, 2)))(qj, kj, vj)
    expected_out, expected_lse, expected_grads = varlen_oracle(dout, q, k, v, cu_q, cu_k,
                                                               options)
    assert_close(out, expected_out, TOL[dtype][0], "out")
    lse = np.asarray(lse, dtype=np.float64)
    np.testing.assert_array_equal(np.isfinite(lse), np.isfinite(expected_lse))
    finite = np.isfinite(expected_lse)
    assert np.abs(lse[finite] - expected_lse[finite]).max(initial=0.0) <= LSE_TOL
    for name, grad, want in zip(("dq", "dk", "dv"), grads, expected_grads):
        assert_close(grad, want, TOL[dtype][1], name)


def test_vmap_folds_mapped_dimensions_into_the_batch(rng):
    q, k, v = (rng.standard_normal(s).astype(np.float32)
               for s in ((3, 2, 19, 4, 32), (3, 2, 23, 2, 32), (3, 2, 23, 2, 32)))
    out = jax.jit(jax.vmap(lambda q, k, v: fj.attention(q, k, v, causal=True)))(q, k, v)
    flat = flashcpp.attention(q.reshape(6, 19, 4, 32), k.reshape(6, 23, 2, 32),
                              v.reshape(6, 23, 2, 32), causal=True)
    np.testing.assert_array_equal(np.asarray(out).reshape(flat.shape), flat)
    # Only q mapped: k and v are broadcast over the mapped dimension.
    out_q = jax.vmap(lambda q: fj.attention(q, k[1], v[1]))(q)
    for i in range(3):
        np.testing.assert_array_equal(np.asarray(out_q[i]), flashcpp.attention(q[i], k[1], v[1]))
    grads = jax.vmap(jax.grad(lambda q, k, v: fj.attention(q, k, v).sum(), argnums=(0, 1, 2)))(
        q, k, v)
    for i in range(3):
        dout = np.ones((2, 19, 4, 32), np.float32)
        o, lse = flashcpp.attention(q[i], k[i], v[i], return_lse=True)
        for got, want in zip(grads, flashcpp.attention_backward(dout, q[i], k[i], v[i], o, lse)):
            np.testing.assert_array_equal(np.asarray(got[i]), want)


SHARD_MAP_SCRIPT = """
import numpy as np, jax, flashcpp, flashcpp.jax as fj
from jax.sharding import Mesh, PartitionSpec as P
shard_map = getattr(jax, "shard_map", None)
if shard_map is None:
    from jax.experimental.shard_map import shard_map
mesh = Mesh(np.array(jax.devices()), ("b",))
rng = np.random.default_rng(3)
q = rng.standard_normal((4, 33, 2, 32)).astype(np.float32)
k, v = (rng.standard_normal((2, 41, 1, 32)).astype(np.float32) for _ in range(2))
# q split over the mesh, k and v replicated: their gradients sum over the shards.
f = shard_map(lambda q, k, v: fj.attention(q, k, v, causal=True), mesh=mesh,
              in_specs=(P("b"), P(), P()), out_specs=P("b"))
out = jax.jit(f)(q, k, v)
dq, dk, dv = jax.jit(jax.grad(lambda q, k, v: f(q, k, v).sum(), argnums=(0, 1, 2)))(q, k, v)
want_dk, want_dv = 0, 0
for rows in (slice(0, 2), slice(2, 4)):
    o, lse = flashcpp.attention(q[rows], k, v, causal=True, return_lse=True)
    np.testing.assert_array_equal(np.asarray(out)[rows], o)
    grads = flashcpp.attention_backward(np.ones_like(o), q[rows], k, v, o, lse, causal=True)
    np.testing.assert_array_equal(np.asarray(dq)[rows], grads[0])
    want_dk, want_dv = want_dk + grads[1], want_dv + grads[2]
np.testing.assert_allclose(np.asarray(dk), want_dk, rtol=1e-6, atol=1e-6)
np.testing.assert_allclose(np.asarray(dv), want_dv, rtol=1e-6, atol=1e-6)
cu = np.array([0, 20, 33], np.int32)
fv = shard_map(lambda q: fj.attention_varlen(q[0], k[0], v[0], cu, cu, 20, 20)[None],
               mesh=mesh, in_specs=P("b"), out_specs=P("b"))
ov = jax.jit(fv)(q[:2, :, :, :])
np.testing.assert_array_equal(np.asarray(ov)[1],
                              flashcpp.attention_varlen(q[1], k[0], v[0], cu, cu, 20, 20))
jax.jit(jax.grad(lambda q: fv(q).sum()))(q[:2])
print("shard_map ok")
"""


def test_shard_map_over_two_cpu_devices():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
               JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", SHARD_MAP_SCRIPT], capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 0 and "shard_map ok" in done.stdout, done.stderr[-3000:]


def test_flashcpp_attention_hands_tracers_to_flashcpp_jax(rng):
    q, k, v = (rng.standard_normal((2, 17, 2, 64)).astype(np.float32) for _ in range(3))
    out = jax.jit(lambda q, k, v: flashcpp.attention(q, k, v, causal=True))(q, k, v)
    np.testing.assert_array_equal(np.asarray(out), flashcpp.attention(q, k, v, causal=True))
    dq = jax.grad(lambda q: flashcpp.attention(q, k, v).sum())(jnp.asarray(q))
    assert dq.shape == q.shape
    out_fa = jax.jit(lambda q, k, v: flashcpp.compat.flash_attn_func(q, k, v, causal=True))(
        q, k, v)
    np.testing.assert_array_equal(np.asarray(out_fa), np.asarray(out))
    cu = np.array([0, 17], np.int32)
    out_varlen = jax.jit(lambda q: flashcpp.attention_varlen(q[0], k[0], v[0], cu, cu, 17, 17,
                                                             causal=True))(q)
    np.testing.assert_array_equal(np.asarray(out_varlen), np.asarray(out)[0])
    with pytest.raises(NotImplementedError, match="attention_with_kvcache"):
        jax.jit(lambda q: flashcpp.attention_with_kvcache(q, k, v))(q)
    with pytest.raises(ValueError, match="JAX tracing"):
        jax.jit(lambda q: flashcpp.attention(q, k, v, num_splits=2))(q)


def test_lse_is_returned_without_gradient(rng):
    q, k, v = (rng.standard_normal((1, 9, 2, 32)).astype(np.float32) for _ in range(3))
    dq = jax.grad(lambda q: fj.attention(q, k, v, return_lse=True)[1].sum())(jnp.asarray(q))
    np.testing.assert_array_equal(np.asarray(dq), 0.0)


def test_eager_call_and_backend_option(rng):
    q, k, v = (rng.standard_normal((1, 33, 2, 64)).astype(np.float32) for _ in range(3))
    fast = fj.attention(q, k, v, causal=True)  # outside jit: one compiled custom call
    exact = fj.attention(q, k, v, causal=True, backend="cpu_reference")
    expected, _ = ref.forward(q, k, v, causal=True)
    assert_close(fast, expected, TOL["float32"][0], "out (cpu)")
    assert_close(exact, expected, 1e-6, "out (cpu_reference)")
    det = jax.jit(jax.grad(lambda q: fj.attention(q, k, v, deterministic=True).sum()))
    np.testing.assert_array_equal(np.asarray(det(q)), np.asarray(det(q)))


def test_bad_inputs_are_named(rng):
    q = rng.standard_normal((2, 17, 4, 64)).astype(np.float32)
    k = rng.standard_normal((2, 19, 2, 64)).astype(np.float32)
    with pytest.raises(flashcpp.Error, match="q: expected 4 dimensions"):
        fj.attention(q[0], k, k)
    with pytest.raises(flashcpp.Error, match="v: dtype float16 differs"):
        fj.attention(q, k, k.astype(np.float16))
    with pytest.raises(TypeError, match="q: dtype int32 is not supported"):
        fj.attention(q.astype(np.int32), k, k)
    with pytest.raises(flashcpp.Error, match="backend: expected one of"):
        fj.attention(q, k, k, backend="tpu")
    with pytest.raises(TypeError, match="window"):
        fj.attention(q, k, k, window=3)
    # Checked where the call runs (the library's validation): an error naming the argument.
    with pytest.raises(Exception, match="v: expected keys 19"):
        jax.jit(fj.attention)(q, k, k[:, :11]).block_until_ready()
    with pytest.raises(Exception, match="head dim 60 is not supported"):
        fj.attention(q[..., :60], k[..., :60], k[..., :60]).block_until_ready()
    cu = np.array([0, 17], np.int32)
    with pytest.raises(flashcpp.Error, match="cu_seqlens_k: expected int32"):
        fj.attention_varlen(q[0], k[0], k[0], cu, cu.astype(np.float32), 17, 19)
    with pytest.raises(TypeError, match="max_seqlen_q: expected an int"):
        fj.attention_varlen(q[0], k[0], k[0], cu, cu, 17.5, 19)


def test_workspace_query_at_trace_time():
    """The CUDA workspace query behind every traced call (run here even in a CPU build, where
    it must refuse: CUDA calls cannot run)."""
    shapes = ([2, 128, 4, 128], [2, 128, 2, 128], [2, 128, 2, 128])
    for for_backward in (False, True):
        if not flashcpp.built_with_cuda:
            with pytest.raises(flashcpp.Error, match="built without CUDA"):
                flashcpp._C.xla_workspace_size(for_backward, "bfloat16", *shapes, 0,
                                               causal=True, softmax_scale=0.1)
        elif flashcpp.cuda_available():
            padded = flashcpp._C.xla_workspace_size(for_backward, "bfloat16", *shapes, 0,
                                                    causal=True, softmax_scale=0.1)
            varlen = flashcpp._C.xla_workspace_size(for_backward, "bfloat16",
                                                    *(s[1:] for s in shapes), 0, 2, 64, 64)
            assert padded >= 0 and varlen >= 0
            if for_backward:  # the fp32 dq accumulator at least
                assert padded >= 2 * 128 * 4 * 128 * 4


def test_handlers_newer_than_the_running_jaxlib_are_not_registered():
    # XLA takes handlers of its own major FFI API version and an older or equal minor one;
    # registering others would make it fail to start its backend.
    assert fj.version_problem((0, 1), (0, 3)) is None
    assert fj.version_problem((0, 3), (0, 3)) is None
    assert fj.version_problem((0, 1), None) is None  # a jaxlib without headers: not known
    assert "newer than this jaxlib" in fj.version_problem((0, 3), (0, 1))
    assert fj.version_problem((1, 0), (0, 3)) is not None
    assert fj.version_problem((0, 3), (1, 0)) is not None
    assert fj._running_api_version() is not None  # jaxlib ships its headers (0.4.31 on)


def test_missing_handlers_error_names_what_is_missing(monkeypatch):
    monkeypatch.setattr(flashcpp._C, "has_xla_ffi", False, raising=False)
    with pytest.raises(RuntimeError, match="no XLA FFI handlers.*FLASHCPP_XLA_FFI_INCLUDE_DIR"):
        fj.attention(np.zeros((1, 1, 1, 8), np.float32), np.zeros((1, 1, 1, 8), np.float32),
                     np.zeros((1, 1, 1, 8), np.float32))


# ---- CUDA (the GPU machine) --------------------------------------------------------------


def jax_gpu():
    for platform in ("cuda", "gpu"):
        try:
            devices = jax.devices(platform)
        except RuntimeError:
            continue
        if devices:
            return devices[0]
    return None


needs_cuda = pytest.mark.skipif(
    not flashcpp.cuda_available() or jax_gpu() is None,
    reason="needs a CUDA GPU that flashcpp and JAX both see")


@needs_cuda
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("options", OPTIONS, ids=OPTION_IDS)
def test_cuda_jit_forward_and_grad_match_oracle(dtype, options):
    case = (2, 113, 203, 4, 2, 128)  # 128: the head dim every CUDA build has
    q, k, v, dout = inputs(case, dtype, seed=5)
    device = jax_gpu()
    qj, kj, vj, doj = (jax.device_put(jnp.asarray(x, dtype=dtype), device)
                       for x in (q, k, v, dout))

    def loss(q, k, v):
        return (fj.attention(q, k, v, **options).astype(jnp.float32) * doj).sum()

    out = jax.jit(lambda q, k, v: fj.attention(q, k, v, **options))(qj, kj, vj)
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(qj, kj, vj)
    assert list(out.devices())[0].platform == "gpu"
    oracle = dict(options, scale=options.get("softmax_scale"))
    oracle.pop("softmax_scale", None)
    expected_out, _ = ref.forward(q, k, v, **oracle)
    assert_close(out, expected_out, TOL[dtype][0], "out")
    for name, grad, want in zip(("dq", "dk", "dv"), grads, ref.backward(dout, q, k, v, **oracle)):
        assert_close(grad, want, 2 * TOL[dtype][1], name)  # fp32 atomics of dq: a bit more


@needs_cuda
@pytest.mark.parametrize("options", OPTIONS[:2], ids=OPTION_IDS[:2])
def test_cuda_jit_varlen_forward_and_grad_match_oracle(options):
    dtype = "bfloat16"
    q, k, v, dout, cu_q, cu_k, max_q, max_k = packed_case(7, dtype)
    pad = 128 - q.shape[-1]  # the head dim every CUDA build has
    q, k, v, dout = (np.pad(x, ((0, 0), (0, 0), (0, pad))) for x in (q, k, v, dout))
    device = jax_gpu()
    qj, kj, vj, doj = (jax.device_put(jnp.asarray(x, dtype=dtype), device)
                       for x in (q, k, v, dout))

    def run(q, k, v):
        return fj.attention_varlen(q, k, v, jnp.asarray(cu_q), jnp.asarray(cu_k), max_q, max_k,
                                   **options)

    out = jax.jit(run)(qj, kj, vj)
    grads = jax.jit(jax.grad(lambda q, k, v: (run(q, k, v).astype(jnp.float32) * doj).sum(),
                             argnums=(0, 1, 2)))(qj, kj, vj)
    expected_out, _, expected_grads = varlen_oracle(dout, q, k, v, cu_q, cu_k, options)
    assert_close(out, expected_out, TOL[dtype][0], "out")  # tail rows: 0
    for name, grad, want in zip(("dq", "dk", "dv"), grads, expected_grads):
        assert_close(grad, want, 2 * TOL[dtype][1], name)
