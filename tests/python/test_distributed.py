"""flashcpp.distributed (context parallelism) on gloo process groups of 2, 3 and 4 CPU ranks
spawned by the tests: ring attention forward and backward against the single-process flashcpp
result and float64, the block plan against the global mask, the merge, the sharding helpers,
and a failing rank that must not leave the others hung. Skipped without PyTorch."""

import datetime

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
dist = pytest.importorskip("torch.distributed", reason="torch.distributed is not available")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

import flashcpp  # noqa: E402
import flashcpp.torch as fa  # noqa: E402
from flashcpp import distributed as cp  # noqa: E402
from flashcpp.distributed.block_plan import mask_bounds, plan_calls  # noqa: E402
from flashcpp.distributed.sharding import shard_rows, shard_segments  # noqa: E402

import _reference as ref  # noqa: E402
import _ring_cases  # noqa: E402
from _ranks import assert_all_ok, run_ranks  # noqa: E402

MASKS = [(False, (-1, -1)), (True, (-1, -1)), (False, (0, 0)), (True, (3, -1)), (False, (2, 5)),
         (False, (6, 1)), (True, (30, -1))]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
def test_block_plan_covers_the_global_mask_exactly_once(world_size, layout):
    for n in list(range(0, 13)) + [29, 40]:
        for causal, window in MASKS:
            full = ref.visible(n, n, causal, window)
            bounds = mask_bounds(causal, window)
            for rank in range(world_size):
                rows = shard_rows(n, rank, world_size, layout)
                for held in range(world_size):
                    keys = shard_rows(n, held, world_size, layout)
                    covered = np.zeros((len(rows), len(keys)), dtype=int)
                    calls = plan_calls(shard_segments(n, rank, world_size, layout),
                                       shard_segments(n, held, world_size, layout), *bounds)
                    for c in calls:
                        assert c.window_left >= -1 and c.window_right >= -1
                        covered[c.q0:c.q1, c.k0:c.k1] += ref.visible(
                            c.q1 - c.q0, c.k1 - c.k0, c.causal, (c.window_left, c.window_right))
                    want = full[np.ix_(rows, keys)] if rows and keys else covered.astype(bool)
                    assert covered.max(initial=0) <= 1, (n, causal, window, rank, held)
                    np.testing.assert_array_equal(covered.astype(bool), want,
                                                  err_msg=str((n, causal, window, rank, held)))


@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_zigzag_causal_is_one_call_a_step_with_equal_work(world_size):
    n = 16 * world_size
    segments = [shard_segments(n, r, world_size, "zigzag") for r in range(world_size)]
    work = []
    for rank in range(world_size):
        total = 0
        for held in range(world_size):
            calls = plan_calls(segments[rank], segments[held], None, 0)
            assert len(calls) == 1
            total += sum(ref.visible(c.q1 - c.q0, c.k1 - c.k0, c.causal).sum() for c in calls)
        work.append(total)
    assert len(set(work)) == 1, work


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
def test_shard_and_unshard_round_trip(layout):
    for n in (0, 1, 5, 16, 23):
        for world_size in (1, 2, 3, 4):
            x = torch.arange(2 * n * 3, dtype=torch.float32).reshape(2, n, 3)
            shards = [cp.shard_sequence(x, r, world_size, layout=layout)
                      for r in range(world_size)]
            assert sum(s.shape[1] for s in shards) == n
            torch.testing.assert_close(cp.unshard_sequence(shards, layout=layout), x,
                                       rtol=0, atol=0)
    cu = [0, 3, 3, 12, 20]
    packed = torch.arange(20 * 2, dtype=torch.float32).reshape(20, 2)
    shards = [cp.shard_varlen(packed, cu, r, 3, layout=layout) for r in range(3)]
    for r, shard in enumerate(shards):
        assert cp.local_cu_seqlens(cu, r, 3, layout)[-1] == shard.shape[0]
    torch.testing.assert_close(cp.unshard_varlen(shards, cu, layout=layout), packed,
                               rtol=0, atol=0)


def test_zigzag_layout_is_the_known_one():
    # 2W chunks, rank r holds chunks r and 2W-1-r
    assert shard_rows(8, 0, 2, "zigzag") == [0, 1, 6, 7]
    assert shard_rows(8, 1, 2, "zigzag") == [2, 3, 4, 5]
    assert shard_rows(3, 1, 2, "zigzag") == [1, 2]   # uneven: chunk sizes 1, 1, 1, 0
    assert shard_rows(2, 2, 3, "contiguous") == []   # an empty shard


def test_merge_of_two_key_halves_is_exact_and_nan_free():
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 12, 2, 16, generator=g) for _ in range(3))
    whole, whole_lse = fa.attention(q, k, v, causal=True, return_lse=True)
    # keys [0, 6) and [6, 12) of a causal mask: rows 0-5 see nothing of the second half
    first, lse1 = fa.attention(q, k[:, :6], v[:, :6], window=(-1, 6), return_lse=True)
    second, lse2 = fa.attention(q, k[:, 6:], v[:, 6:], causal=True, return_lse=True)
    assert torch.isinf(lse2[..., :6]).all()
    out, lse = first.float().clone(), lse1.clone()
    cp.merge_partial(out, lse, second, lse2)
    torch.testing.assert_close(out, whole, atol=2e-6, rtol=0)
    torch.testing.assert_close(lse, whole_lse, atol=2e-6, rtol=0)
    # a row with no visible key in either part stays out 0, lse -inf
    empty_out = torch.zeros(1, 3, 2, 16)
    empty_lse = torch.full((1, 2, 3), float("-inf"))
    cp.merge_partial(empty_out, empty_lse, torch.zeros(1, 3, 2, 16),
                     torch.full((1, 2, 3), float("-inf")))
    assert not torch.isnan(empty_out).any() and (empty_out == 0).all()
    assert torch.isneginf(empty_lse).all()
    assert torch.isneginf(cp.merged_lse(torch.tensor(float("-inf")),
                                        torch.tensor(float("-inf"))))


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ring_attention_matches_single_process(world_size):
    names = assert_all_ok(run_ranks(_ring_cases.run_cases, world_size, 100 * world_size))
    expected = [case["name"] for case in _ring_cases.CASES] + ["random", "random-varlen"]
    extra = {2: ["compiled"], 3: [], 4: ["subgroup"]}[world_size]
    assert names[1] == expected + extra


def test_a_failing_rank_leaves_no_rank_hung():
    # The last rank stays alive past the process group's timeout, then raises: the others
    # must fail with gloo's timeout, well before the harness's deadline.
    outcome = run_ranks(_ring_cases.raise_on_last_rank, 2, 4.0, pg_timeout_s=2.0,
                        deadline_s=60.0)
    statuses = {rank: status for rank, (status, _) in outcome.items()}
    assert statuses == {0: "error", 1: "error"}, outcome
    assert "fails on purpose" in outcome[1][1]
    assert "Timed out" in outcome[0][1] or "Connection closed" in outcome[0][1]


@pytest.fixture
def single_rank_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1, timeout=datetime.timedelta(seconds=20))
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_world_size_one_is_plain_flashcpp(single_rank_group):
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 40, 4, 32, generator=g).requires_grad_() for _ in range(3))
    out = cp.ring_attention(q, k, v, causal=True)
    out.sum().backward()
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    plain = fa.attention(*leaves, causal=True)
    plain.sum().backward()
    torch.testing.assert_close(out, plain, rtol=0, atol=0)
    for ours, theirs in zip((q, k, v), leaves):
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=0, atol=0)


def test_bad_arguments_name_what_is_wrong(single_rank_group):
    x = torch.zeros(1, 8, 2, 16)
    with pytest.raises(flashcpp.Error, match="layout: expected one of zigzag, contiguous"):
        cp.ring_attention(x, x, x, layout="striped")
    with pytest.raises(flashcpp.Error, match=r"k: expected 4 dimensions"):
        cp.ring_attention(x, x[0], x)
    with pytest.raises(flashcpp.Error, match=r"v: expected the leading dimensions \(1, 8\)"):
        cp.ring_attention(x, x, x[:, :4])
    with pytest.raises(flashcpp.Error, match="q: rank 0 holds 8 rows, but layout zigzag of 9"):
        cp.ring_attention(x, x, x, seq_len=9)
    with pytest.raises(TypeError, match="window: expected a pair"):
        cp.ring_attention(x, x, x, window=3)
    with pytest.raises(flashcpp.Error, match="cu_seqlens: expected 0 followed"):
        cp.ring_attention_varlen(x[0], x[0], x[0], [1, 8])
    with pytest.raises(flashcpp.Error, match="head dim"):  # flashcpp's own checks still run
        cp.ring_attention(x[..., :12], x[..., :12], x[..., :12])

