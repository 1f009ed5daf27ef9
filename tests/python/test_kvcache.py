"""flashcpp.attention_with_kvcache and flashcpp.torch's KV-cache ops against a float64 NumPy
oracle: contiguous and paged caches (shuffled block tables), appends in place, GQA/MQA, masks,
lse, empty sequences, NaN in cache memory no sequence owns, the errors; PyTorch on the CPU
(eager, opcheck, torch.compile) and on CUDA (eager, torch.compile(fullgraph=True), CUDA graph
capture and replay with new lengths and block-table contents), CuPy on CUDA.

The oracle gathers each sequence's keys from the cache (through the block table), appends the
new ones, and runs _reference.forward over them: the cache bookkeeping is written here, apart
from flashcpp's.
"""

import numpy as np
import pytest

import flashcpp
import _reference as ref

# As in test_numpy_forward.py: fp32 accumulation drift; fp16 output and P rounding.
OUT_TOL = {np.float32: 2e-5, np.float16: 2.0**-9}
LSE_TOL = 5e-5


class Cache:
    """A KV cache in NumPy: `lens[b]` random keys per sequence, NaN in every other row (rows
    past a length, spare pages), and the keys and values of each sequence in order."""

    def __init__(self, rng, lens, capacity, hkv, d, dv, dtype=np.float32, page_size=None):
        batch = len(lens)
        self.lens = np.array(lens, np.int32)
        self.page_size = page_size
        if page_size is None:
            self.block_table = None
            shape = (batch, capacity)
        else:
            pages = capacity // page_size
            num_pages = batch * pages + 3  # three pages no sequence uses
            self.block_table = rng.permutation(num_pages)[:batch * pages].reshape(
                batch, pages).astype(np.int32)
            shape = (num_pages, page_size)
        self.k = np.full(shape + (hkv, d), np.nan, dtype)
        self.v = np.full(shape + (hkv, dv), np.nan, dtype)
        self.keys = [rng.standard_normal((n, hkv, d)).astype(dtype) for n in lens]
        self.values = [rng.standard_normal((n, hkv, dv)).astype(dtype) for n in lens]
        for b, n in enumerate(lens):
            self.k[self.rows(b, 0, n)] = self.keys[b]
            self.v[self.rows(b, 0, n)] = self.values[b]

    def rows(self, b, start, stop):
        """Index of the cache rows that hold keys start..stop-1 of sequence b."""
        positions = np.arange(start, stop)
        if self.block_table is None:
            return np.full_like(positions, b), positions
        return self.block_table[b, positions // self.page_size], positions % self.page_size

    def appended(self, k_new, v_new):
        """The caches after appending k_new/v_new [B, Nnew, Hkv, D] at each sequence's end."""
        k, v = self.k.copy(), self.v.copy()
        for b, n in enumerate(self.lens):
            k[self.rows(b, n, n + k_new.shape[1])] = k_new[b]
            v[self.rows(b, n, n + v_new.shape[1])] = v_new[b]
        return k, v

    def oracle(self, q, k_new=None, v_new=None, **options):
        """float64 out [B, Nnew, Hq, Dv] and lse [B, Hq, Nnew]; options as _reference.forward."""
        outs, lses = [], []
        for b in range(len(self.lens)):
            keys, values = self.keys[b], self.values[b]
            if k_new is not None:
                keys = np.concatenate([keys, k_new[b]])
                values = np.concatenate([values, v_new[b]])
            out, lse = ref.forward(q[b:b + 1], keys[None], values[None], **options)
            outs.append(out)
            lses.append(lse)
        return np.concatenate(outs), np.concatenate(lses)


def assert_out_close(actual, expected, dtype):
    assert np.isfinite(actual).all(), "NaN or inf in out"
    bound = OUT_TOL[dtype] * (1.0 + np.abs(expected).max(initial=0.0))
    err = np.abs(np.asarray(actual, np.float64) - expected).max(initial=0.0)
    assert err <= bound, f"max |out - ref| = {err:.3g} > {bound:.3g}"


def assert_lse_close(actual, expected):
    actual = np.asarray(actual)
    assert actual.dtype == np.float32
    finite = np.isfinite(expected)
    np.testing.assert_array_equal(np.isfinite(actual), finite)
    assert np.all(actual[~finite] == -np.inf)
    err = np.abs(actual[finite] - expected[finite]).max(initial=0.0)
    assert err <= LSE_TOL * (1.0 + np.abs(expected[finite]).max(initial=0.0)), f"lse err {err:.3g}"


def new_tokens(rng, batch, nnew, hq, hkv, d, dv, dtype=np.float32):
    return (rng.standard_normal((batch, nnew, hq, d)).astype(dtype),
            rng.standard_normal((batch, nnew, hkv, d)).astype(dtype),
            rng.standard_normal((batch, nnew, hkv, dv)).astype(dtype))


# ---- NumPy on the CPU -----------------------------------------------------------------------
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("nnew", [1, 5])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (6, 1)], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize("append", [False, True], ids=["read", "append"])
@pytest.mark.parametrize("page_size", [None, 16], ids=["contiguous", "paged"])
def test_matches_oracle(rng, page_size, append, heads, nnew, causal):
    hq, hkv = heads
    capacity, d = 48, 32
    # An empty sequence (no key at all when nothing is appended), one partly full, one that
    # ends exactly at the capacity once the new tokens are in.
    lens = [0, 21, capacity - nnew]
    cache = Cache(rng, lens, capacity, hkv, d, d, page_size=page_size)
    q, k_new, v_new = new_tokens(rng, len(lens), nnew, hq, hkv, d, d)
    if not append:
        k_new = v_new = None
    k_cache, v_cache = cache.k.copy(), cache.v.copy()
    out, lse = flashcpp.attention_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, cache_seqlens=cache.lens,
        block_table=cache.block_table, causal=causal, return_softmax_lse=True)
    assert out.shape == (len(lens), nnew, hq, d) and out.dtype == np.float32
    assert lse.shape == (len(lens), hq, nnew)
    expected_out, expected_lse = cache.oracle(q, k_new, v_new, causal=causal)
    assert_out_close(out, expected_out, np.float32)
    assert_lse_close(lse, expected_lse)
    # The append lands in place (NaN rows elsewhere untouched); without one, nothing changes.
    expected_k, expected_v = cache.appended(k_new, v_new) if append else (cache.k, cache.v)
    np.testing.assert_array_equal(k_cache, expected_k)
    np.testing.assert_array_equal(v_cache, expected_v)
    assert flashcpp.last_run_info().backend == "cpu"


@pytest.mark.parametrize("backend", ["cpu", "cpu_reference"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("options", [
    dict(window_size=(8, 0)),
    dict(causal=True, window_size=(5, -1)),
    dict(window_size=(3, 2)),
    dict(causal=True, softcap=2.0, softmax_scale=0.2),
], ids=["window-8-0", "causal-window-5", "window-3-2", "softcap-scale"])
def test_masks_softcap_scale_dtypes_backends(rng, backend, dtype, options):
    cache = Cache(rng, [28, 3, 17], 32, 2, 64, 64, dtype=dtype, page_size=8)
    q, k_new, v_new = new_tokens(rng, 3, 4, 4, 2, 64, 64, dtype)
    out, lse = flashcpp.attention_with_kvcache(
        q, cache.k.copy(), cache.v.copy(), k_new, v_new, cache_seqlens=cache.lens,
        block_table=cache.block_table, return_softmax_lse=True, backend=backend, **options)
    expected_out, expected_lse = cache.oracle(
        q, k_new, v_new, causal=options.get("causal", False),
        window=options.get("window_size", (-1, -1)), softcap=options.get("softcap", 0.0),
        scale=options.get("softmax_scale"))
    assert out.dtype == dtype
    assert_out_close(out, expected_out, dtype)
    assert_lse_close(lse, expected_lse)
    assert flashcpp.last_run_info().backend == backend


def test_int_and_none_cache_seqlens(rng):
    # An int is every sequence's length; None is the whole capacity (as in FlashAttention).
    full = Cache(rng, [24, 24], 24, 2, 32, 32, page_size=8)
    q = rng.standard_normal((2, 3, 4, 32)).astype(np.float32)
    expected, _ = full.oracle(q, causal=True)
    for lens in (24, np.int64(24), None):
        out = flashcpp.attention_with_kvcache(q, full.k, full.v, cache_seqlens=lens,
                                              block_table=full.block_table, causal=True)
        assert_out_close(out, expected, np.float32)
    contiguous = Cache(rng, [10, 10], 10, 1, 32, 32)
    expected, _ = contiguous.oracle(q)
    for lens in (10, None):
        out = flashcpp.attention_with_kvcache(q, contiguous.k, contiguous.v, cache_seqlens=lens)
        assert_out_close(out, expected, np.float32)


def test_strided_cache_and_preallocated_out(rng):
    # The cache as transformers keeps it, [B, Hkv, Nmax, D], viewed as [B, Nmax, Hkv, D] with
    # no copy: the append writes through to that memory. Dv != D, out given.
    cache = Cache(rng, [5, 11], 16, 2, 64, 32)
    k_bhnd = np.ascontiguousarray(cache.k.transpose(0, 2, 1, 3))
    v_bhnd = np.ascontiguousarray(cache.v.transpose(0, 2, 1, 3))
    q, k_new, v_new = new_tokens(rng, 2, 2, 4, 2, 64, 32)
    out = np.empty((2, 2, 4, 32), np.float32)
    got = flashcpp.attention_with_kvcache(
        q, k_bhnd.transpose(0, 2, 1, 3), v_bhnd.transpose(0, 2, 1, 3), k_new, v_new,
        cache_seqlens=cache.lens, causal=True, out=out)
    assert got is out
    assert_out_close(out, cache.oracle(q, k_new, v_new, causal=True)[0], np.float32)
    expected_k, expected_v = cache.appended(k_new, v_new)
    np.testing.assert_array_equal(k_bhnd.transpose(0, 2, 1, 3), expected_k)
    np.testing.assert_array_equal(v_bhnd.transpose(0, 2, 1, 3), expected_v)


def error_case(rng):
    cache = Cache(rng, [3, 6], 8, 2, 32, 32, page_size=4)
    q, k_new, v_new = new_tokens(rng, 2, 1, 4, 2, 32, 32)
    return q, cache, k_new, v_new


@pytest.mark.parametrize("change, error, message", [
    (dict(block_table=lambda c: c.block_table.astype(np.int64)), ValueError,
     r"block_table: expected dtype int32, got int64"),
    (dict(cache_seqlens=lambda c: c.lens.astype(np.int64)), ValueError,
     r"cache_seqlens: expected dtype int32, got int64"),
    (dict(v=None), ValueError, r"k and v \(the new keys and values to append\) must be given"),
    (dict(cache_seqlens=lambda c: np.array([3, 8], np.int32)), ValueError,
     r"k_new: sequence 1 would hold 9 keys \(cache_seqlens\[1\] = 8 plus the new tokens\), "
     r"more than the cache's capacity of 8"),
    (dict(cache_seqlens=lambda c: np.array([-1, 3], np.int32)), ValueError,
     r"cache_seqlens\[0\]: must be >= 0, got -1"),
    (dict(block_table=lambda c: np.array([[99, 0], [1, 2]], np.int32)), ValueError,
     r"block_table\[0\]\[0\]: page 99 is outside the cache's 7 pages"),
    (dict(k=lambda c: np.zeros((2, 1, 4, 32), np.float32)), ValueError,
     r"k_new: .*kv heads"),
    (dict(cache_seqlens=lambda c: c.lens[:1]), ValueError, r"cache_seqlens: .*batch size"),
    (dict(cache_seqlens=lambda c: c.lens.astype(np.float32)), ValueError,
     r"cache_seqlens: expected dtype int32, got fp32"),
    (dict(block_table=lambda c: c.block_table.astype(np.uint8)), TypeError,
     r"block_table: dtype uint8 is not supported"),
    (dict(window_size=3), TypeError, r"window: expected a pair"),
], ids=["int64-block-table", "int64-lengths", "k-without-v", "over-capacity", "negative-length",
        "page-out-of-range", "k-heads", "lengths-batch", "float-lengths", "uint8-block-table",
        "window-type"])
def test_errors(rng, change, error, message):
    q, cache, k_new, v_new = error_case(rng)
    args = dict(k=k_new, v=v_new, cache_seqlens=cache.lens, block_table=cache.block_table)
    for name, value in change.items():
        args[name] = value(cache) if callable(value) else value
    with pytest.raises(error, match=message):
        flashcpp.attention_with_kvcache(q, cache.k, cache.v, **args)


def test_read_only_cache_is_refused_only_for_an_append(rng):
    q, cache, k_new, v_new = error_case(rng)
    for t in (cache.k, cache.v):
        t.setflags(write=False)
    args = dict(cache_seqlens=cache.lens, block_table=cache.block_table)
    flashcpp.attention_with_kvcache(q, cache.k, cache.v, **args)  # reads only
    with pytest.raises(ValueError, match=r"k_cache: array is read-only"):
        flashcpp.attention_with_kvcache(q, cache.k, cache.v, k_new, v_new, **args)


# ---- PyTorch --------------------------------------------------------------------------------
@pytest.fixture
def torch():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    import flashcpp.torch  # noqa: F401  registers the ops

    return torch


def torch_case(torch, rng, dtype, device, page_size=8, nnew=2, lens=(13, 0, 30), capacity=32):
    """(q, k_cache, v_cache, k, v, cache_seqlens, block_table) as torch tensors, and the Cache
    they came from, its values rounded to `dtype` so that the oracle sees what flashcpp sees."""
    def rounded(a):
        return torch.from_numpy(a).to(dtype).float().numpy()

    cache = Cache(rng, list(lens), capacity, 2, 64, 64, page_size=page_size)
    cache.k, cache.v = rounded(cache.k), rounded(cache.v)
    cache.keys, cache.values = ([rounded(x) for x in xs] for xs in (cache.keys, cache.values))
    arrays = [rounded(a) for a in new_tokens(rng, len(lens), nnew, 4, 2, 64, 64)]
    q, k, v, k_cache, v_cache = (torch.from_numpy(a).to(device=device, dtype=dtype)
                                 for a in (*arrays, cache.k, cache.v))
    lens = torch.from_numpy(cache.lens).to(device)
    table = None if page_size is None else torch.from_numpy(cache.block_table).to(device)
    return [q, k_cache, v_cache, k, v, lens, table], cache


def check_torch(torch, cache, q, k, v, k_cache, v_cache, out, lse, causal=True):
    """out and lse of an appending call against the oracle, and the caches after it. fp32 as
    for NumPy; fp16/bf16 on the GPU: 4 units of roundoff of the output's scale (its rounding
    and P's before P @ V take about 2; a key missed or wrong among ~30 costs far more), lse to
    1e-3 (fp32 statistics from rounded scores, fast exp)."""
    q, k, v = (t.float().cpu().numpy() for t in (q, k, v))
    expected_out, expected_lse = cache.oracle(q, k, v, causal=causal)
    if out.dtype == torch.float32:
        assert_out_close(out.numpy(), expected_out, np.float32)
        assert_lse_close(lse.numpy(), expected_lse)
    else:
        unit = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}[out.dtype]
        err = np.abs(out.double().cpu().numpy() - expected_out).max()
        bound = 4 * unit * max(1.0, np.abs(expected_out).max())
        assert err <= bound, f"out err {err:.3g} > {bound:.3g}"
        lse, finite = lse.cpu().numpy(), np.isfinite(expected_lse)
        np.testing.assert_array_equal(np.isfinite(lse), finite)
        assert np.abs(lse[finite] - expected_lse[finite]).max(initial=0.0) <= 1e-3
    expected_k, expected_v = (torch.from_numpy(a).to(k_cache.dtype).float().numpy()
                              for a in cache.appended(k, v))
    np.testing.assert_array_equal(k_cache.float().cpu().numpy(), expected_k)
    np.testing.assert_array_equal(v_cache.float().cpu().numpy(), expected_v)


def run_op(fa, args, **options):
    q, k_cache, v_cache, k, v, lens, table = args
    return fa.attention_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lens,
                                     block_table=table, causal=True, return_softmax_lse=True,
                                     **options)


@pytest.mark.parametrize("page_size", [None, 8], ids=["contiguous", "paged"])
def test_torch_op_on_cpu(rng, torch, page_size):
    import flashcpp.torch as fa

    args, cache = torch_case(torch, rng, torch.float32, "cpu", page_size)
    q, k_cache, v_cache, k, v, lens, table = args
    out, lse = run_op(fa, args)
    check_torch(torch, cache, q, k, v, k_cache, v_cache, out, lse)
    # The generic function takes torch tensors too (a direct native call in eager mode).
    k_cache.copy_(torch.from_numpy(cache.k))
    v_cache.copy_(torch.from_numpy(cache.v))
    generic, generic_lse = run_op(flashcpp, args)
    torch.testing.assert_close(generic, out, atol=0, rtol=0)
    check_torch(torch, cache, q, k, v, k_cache, v_cache, generic, generic_lse)


def test_torch_eager_fast_path_only_where_the_op_would_just_run(rng, torch):
    # flashcpp.torch calls the read-only op's implementation directly in plain eager mode (the
    # dispatcher costs more host time than the call); under a dispatch mode, with a tensor
    # subclass or with the profiler on, the op itself runs, and both give the same result.
    import flashcpp.torch as fa
    from torch.utils._python_dispatch import TorchDispatchMode

    (q, k_cache, v_cache, _, _, lens, table), _ = torch_case(torch, rng, torch.float32, "cpu", 8)
    assert fa._direct_call_ok(q, k_cache, v_cache, lens, table)
    assert not fa._direct_call_ok(q, torch.nn.Parameter(k_cache), v_cache, lens, table)

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    direct = fa.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens,
                                       block_table=table, causal=True)
    with Seen() as seen:
        assert not fa._direct_call_ok(q, k_cache, v_cache, lens, table)
        through_op = fa.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens,
                                               block_table=table, causal=True)
    assert any("flashcpp.attention_with_kvcache" in op for op in seen.ops)
    torch.testing.assert_close(through_op, direct, atol=0, rtol=0)
    with torch.profiler.profile() as profile:
        assert not fa._direct_call_ok(q, k_cache, v_cache, lens, table)
        fa.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, block_table=table)
    assert any("flashcpp::attention_with_kvcache" in e.name for e in profile.events())


def test_torch_ops_pass_opcheck(rng, torch):
    # Schema (the declared mutations), fake tensors, AOT dispatch of both ops. The append op
    # runs several times over; it writes the same rows each time.
    (q, k_cache, v_cache, k, v, lens, table), _ = torch_case(torch, rng, torch.float32, "cpu")
    options = (True, None, -1, -1, 0.0, 0, "auto", None, None)  # no descales
    torch.library.opcheck(torch.ops.flashcpp.attention_with_kvcache_append.default,
                          (q, k_cache, v_cache, k, v, lens, table, *options))
    torch.library.opcheck(torch.ops.flashcpp.attention_with_kvcache.default,
                          (q, k_cache, v_cache, lens, table, *options))
    contiguous = torch.randn(3, 16, 2, 64)
    torch.library.opcheck(torch.ops.flashcpp.attention_with_kvcache.default,
                          (q, contiguous, contiguous, lens.clamp(max=16), None, *options))


@pytest.mark.parametrize("function", ["flashcpp.torch", "flashcpp"])
def test_torch_compile_fullgraph_on_cpu(rng, torch, function):
    # The generic flashcpp function hands a call under torch.compile to the custom ops.
    import flashcpp.torch as fa

    torch._dynamo.reset()
    module = fa if function == "flashcpp.torch" else flashcpp
    step = torch.compile(lambda *args: run_op(module, args), fullgraph=True,
                         backend="aot_eager")
    args, cache = torch_case(torch, rng, torch.float32, "cpu")
    q, k_cache, v_cache, k, v, lens, table = args
    out, lse = step(*args)
    check_torch(torch, cache, q, k, v, k_cache, v_cache, out, lse)  # appended in place


# ---- CUDA -----------------------------------------------------------------------------------
needs_gpu = pytest.mark.skipif(not flashcpp.cuda_available(),
                               reason="needs a CUDA GPU and flashcpp built with CUDA")


@needs_gpu
@pytest.mark.parametrize("nnew", [1, 4])
@pytest.mark.parametrize("page_size", [None, 16], ids=["contiguous", "paged"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_torch_cuda_eager(rng, torch, dtype, page_size, nnew):
    import flashcpp.torch as fa
    from flashcpp import _build_info

    if {"bfloat16": "bf16", "float16": "fp16"}[dtype] not in _build_info.dtypes:
        pytest.skip(f"this build has no {dtype} kernels (FLASHCPP_DTYPES)")

    args, cache = torch_case(torch, rng, getattr(torch, dtype), "cuda", page_size, nnew,
                             lens=(13, 0, 32 - nnew))
    q, k_cache, v_cache, k, v, lens, table = args
    out, lse = run_op(fa, args)
    assert flashcpp.last_run_info().backend.startswith("cuda")
    check_torch(torch, cache, q, k, v, k_cache, v_cache, out, lse)
    # The generic function, on the current stream, reading the appended caches.
    out, lse = flashcpp.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens + nnew,
                                               block_table=table, causal=True,
                                               return_softmax_lse=True)
    check_torch(torch, cache, q, k, v, k_cache, v_cache, out, lse)


@needs_gpu
def test_torch_cuda_compile_fullgraph(rng, torch):
    import flashcpp.torch as fa

    torch._dynamo.reset()
    step = torch.compile(lambda *args: run_op(fa, args), fullgraph=True)
    for page_size in (16, None):
        args, cache = torch_case(torch, rng, torch.bfloat16, "cuda", page_size)
        q, k_cache, v_cache, k, v, lens, table = args
        out, lse = step(*args)
        check_torch(torch, cache, q, k, v, k_cache, v_cache, out, lse)


@needs_gpu
@pytest.mark.parametrize("page_size", [None, 16], ids=["contiguous", "paged"])
def test_torch_cuda_graph_replay_with_new_lengths_and_pages(rng, torch, page_size):
    # One capture, replayed over new lengths, block tables, tokens and cache contents: the
    # call reads cache_seqlens and block_table on the device, so nothing is captured stale.
    import flashcpp.torch as fa

    args, _ = torch_case(torch, rng, torch.bfloat16, "cuda", page_size, nnew=1)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside the capture, as PyTorch advises
        run_op(fa, args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = run_op(fa, args)
    for lens in ((31, 0, 5), (1, 17, 31), (0, 0, 0)):
        fresh, cache = torch_case(torch, rng, torch.bfloat16, "cuda", page_size, nnew=1,
                                  lens=lens)
        for static, new in zip(args, fresh):
            if static is not None:
                static.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        q, k_cache, v_cache, k, v = args[:5]
        check_torch(torch, cache, q, k, v, k_cache, v_cache, out, lse)


@needs_gpu
@pytest.mark.parametrize("page_size", [None, 16, 64, 256],
                         ids=["contiguous", "paged16", "paged64", "paged256"])
def test_torch_cuda_prefill_on_the_forward_kernels(rng, torch, page_size):
    # Chunked prefill (64 new tokens or more) runs the forward kernels, contiguous or paged
    # (the paged sm90a forward on Hopper, the paged sm80 one elsewhere); NaN in unused pages.
    import flashcpp.torch as fa

    args, cache = torch_case(torch, rng, torch.bfloat16, "cuda", page_size, nnew=80,
                             lens=(100, 0, 300), capacity=512)
    q, k_cache, v_cache, k, v, lens, table = args
    out, lse = run_op(fa, args)
    kernel = flashcpp.last_run_info().kernel
    check_torch(torch, cache, q, k, v, k_cache, v_cache, out, lse)
    assert "_fwd_" in kernel, kernel
    assert ("_paged" in kernel) == (page_size is not None), kernel


@needs_gpu
def test_cupy(rng):
    cp = pytest.importorskip("cupy")
    cache = Cache(rng, [9, 30], 32, 2, 64, 64, dtype=np.float16, page_size=16)
    q, k_new, v_new = new_tokens(rng, 2, 2, 4, 2, 64, 64, np.float16)
    k_cache, v_cache = cp.asarray(cache.k), cp.asarray(cache.v)
    out, lse = flashcpp.attention_with_kvcache(
        cp.asarray(q), k_cache, v_cache, cp.asarray(k_new), cp.asarray(v_new),
        cache_seqlens=cp.asarray(cache.lens), block_table=cp.asarray(cache.block_table),
        causal=True, return_softmax_lse=True)
    assert isinstance(out, cp.ndarray) and out.dtype == cp.float16
    expected_out, expected_lse = cache.oracle(q, k_new, v_new, causal=True)
    assert_out_close(cp.asnumpy(out), expected_out, np.float16)
    assert np.abs(cp.asnumpy(lse) - expected_lse).max() <= 1e-3  # as in test_cupy_jax.py
    expected_k, expected_v = cache.appended(k_new, v_new)
    np.testing.assert_array_equal(cp.asnumpy(k_cache), expected_k)
    np.testing.assert_array_equal(cp.asnumpy(v_cache), expected_v)
