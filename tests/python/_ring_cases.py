"""What each rank of a test process group runs: ring attention against the single-process
flashcpp result and a float64 computation, forward and backward (test_distributed.py on CPU
ranks over gloo, test_distributed_cuda.py on one GPU a rank over NCCL)."""

from __future__ import annotations

import math
import time

import torch

import _reference as ref


def exact_attention(q, k, v, causal=False, window=(-1, -1), softcap=0.0, scale=None):
    """float64 attention of [B, N, H, D] tensors with the mask of docs/semantics.md, built from
    differentiable torch ops (a row with no visible key gives 0)."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = scale * torch.einsum("bihd,bjhd->bhij", q, k)
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    mask = torch.from_numpy(ref.visible(q.shape[1], k.shape[1], causal, window)).to(s.device)
    s = s.masked_fill(~mask, float("-inf"))
    top = s.amax(-1, keepdim=True).detach()
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    e = torch.exp(s - top)
    p = e / e.sum(-1, keepdim=True).clamp_min(1e-300)
    return torch.einsum("bhij,bjhd->bihd", p, v)


def exact_varlen(q, k, v, cu, **options):
    outs = [exact_attention(q[None, a:b], k[None, a:b], v[None, a:b], **options)[0]
            for a, b in zip(cu, cu[1:]) if b > a]
    return torch.cat(outs) if outs else q.new_zeros(0, q.shape[1], v.shape[2]).double()


NOISE = {torch.float32: 32 * 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def _err(a, b):
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


def check_close(ring, single, exact, dtype, what):
    """The accuracy rule of docs/semantics.md with the single-process flashcpp result as the
    peer: ring's error against float64 at most twice flashcpp's plus the dtype's rounding."""
    scale = 1 + (exact.abs().max().item() if exact.numel() else 0.0)
    bound = 2 * _err(single, exact) + NOISE[dtype] * scale
    err = _err(ring, exact)
    assert err <= bound, f"{what}: ring error {err:.3g} > bound {bound:.3g}"


def _inputs(case, seed, world_size, device):
    g = torch.Generator().manual_seed(seed)
    dtype = case.get("dtype", torch.float32)
    hq, hkv, d = case["heads"][0], case["heads"][1], case["d"]
    if case.get("method") == "ulysses":  # heads per rank
        hq, hkv = hq * world_size, hkv * world_size
    lead = (case["total"],) if "cu" in case else (case["batch"], case["n"])
    shapes = [lead + (hq, d), lead + (hkv, d), lead + (hkv, d), lead + (hq, d)]
    q, k, v, dout = (torch.randn(s, generator=g, dtype=torch.float64).to(device, dtype)
                     for s in shapes)
    return q, k, v, dout


def run_case(case, rank, world_size, seed, device="cpu"):
    import torch.distributed as dist

    import flashcpp.torch as fa
    from flashcpp import distributed as cp

    layout = case.get("layout", "zigzag")
    options = dict(causal=case.get("causal", False), window=case.get("window", (-1, -1)),
                   softcap=case.get("softcap", 0.0))
    q, k, v, dout = _inputs(case, seed, world_size, device)
    dtype = q.dtype
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    if "cu" in case:
        cu = case["cu"]
        cu_t = torch.tensor(cu, dtype=torch.int32, device=device)
        lengths = [b - a for a, b in zip(cu, cu[1:])]
        single = fa.attention_varlen(*leaves, cu_t, cu_t, max(lengths, default=0),
                                     max(lengths, default=0), **options)
        exact_leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
        exact = exact_varlen(*exact_leaves, cu, **options)

        def shard(t):
            return cp.shard_varlen(t, cu, rank, world_size, layout=layout)

        def gather(t):
            sizes = [cp.local_cu_seqlens(cu, r, world_size, layout)[-1]
                     for r in range(world_size)]
            mine = t.new_zeros((max(sizes),) + t.shape[1:])
            mine[:len(t)] = t
            pieces = [torch.empty_like(mine) for _ in range(world_size)]
            dist.all_gather(pieces, mine)
            return cp.unshard_varlen([p[:n] for p, n in zip(pieces, sizes)], cu, layout=layout)

        run = lambda a, b, c: cp.ring_attention_varlen(a, b, c, cu, layout=layout, **options)
    else:
        n = case["n"]
        single = fa.attention(*leaves, **options)
        exact_leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
        exact = exact_attention(*exact_leaves, **options)

        def shard(t):
            return cp.shard_sequence(t, rank, world_size, layout=layout)

        def gather(t):
            return cp.gather_sequence(t.contiguous(), layout=layout, seq_len=n)

        attend = cp.ulysses_attention if case.get("method") == "ulysses" else cp.ring_attention
        run = lambda a, b, c: attend(a, b, c, layout=layout, seq_len=n, **options)

    single.backward(dout)
    exact.backward(dout.double())
    mine = [shard(t).requires_grad_() for t in (q, k, v)]
    out = run(*mine)
    assert out.device == q.device, f"{case['name']}: out on {out.device}, inputs on {q.device}"
    out.backward(shard(dout))
    name = case["name"]
    check_close(gather(out.detach()), single.detach(), exact.detach(), dtype, f"{name} out")
    for label, ours, theirs, want in zip(("dq", "dk", "dv"), mine, leaves, exact_leaves):
        check_close(gather(ours.grad), theirs.grad, want.grad, dtype, f"{name} {label}")
    return name


CASES = [
    dict(name="plain", batch=2, n=24, heads=(2, 2), d=32),
    dict(name="causal-gqa", batch=1, n=29, heads=(4, 2), d=32, causal=True),
    dict(name="causal-window-contiguous", batch=1, n=26, heads=(2, 1), d=16, causal=True,
         window=(5, -1), layout="contiguous"),
    dict(name="window-softcap", batch=1, n=23, heads=(2, 2), d=16, window=(3, 2), softcap=5.0),
    dict(name="causal-bf16", batch=1, n=32, heads=(2, 2), d=32, causal=True,
         dtype=torch.bfloat16),
    dict(name="empty-shards-contiguous", batch=1, n=2, heads=(2, 1), d=16, causal=True,
         layout="contiguous"),
    dict(name="empty-shards-zigzag", batch=2, n=3, heads=(2, 2), d=16),
    dict(name="varlen-causal-gqa", cu=[0, 7, 7, 20, 33], total=33, heads=(4, 2), d=16,
         causal=True),
    dict(name="varlen-window", cu=[0, 11, 30], total=30, heads=(2, 2), d=16, window=(4, 1),
         layout="contiguous"),
    dict(name="ulysses-causal-gqa", method="ulysses", batch=2, n=21, heads=(2, 1), d=16,
         causal=True),
    dict(name="ulysses-window-contiguous-bf16", method="ulysses", batch=1, n=3, heads=(1, 1),
         d=16, window=(2, 0), softcap=3.0, layout="contiguous", dtype=torch.bfloat16),
]


# One GPU a rank (NCCL): the head dims, dtypes and lengths the CUDA kernels serve, lengths that
# cross tile edges and leave uneven shards.
GPU_CASES = [
    dict(name="gpu-plain-d128-bf16", batch=2, n=1536, heads=(4, 4), d=128,
         dtype=torch.bfloat16),
    dict(name="gpu-causal-gqa-d64-fp16", batch=1, n=2048, heads=(8, 2), d=64, causal=True,
         dtype=torch.float16),
    dict(name="gpu-causal-window-contiguous", batch=1, n=1000, heads=(4, 1), d=128,
         causal=True, window=(300, -1), layout="contiguous", dtype=torch.bfloat16),
    dict(name="gpu-window-softcap-d64", batch=1, n=777, heads=(2, 2), d=64, window=(100, 50),
         softcap=30.0, dtype=torch.bfloat16),
    dict(name="gpu-varlen-causal-gqa", cu=[0, 300, 300, 1100, 1901], total=1901, heads=(4, 2),
         d=128, causal=True, dtype=torch.bfloat16),
    dict(name="gpu-ulysses-causal", method="ulysses", batch=1, n=1024, heads=(2, 1), d=128,
         causal=True, dtype=torch.bfloat16),
]


def run_gpu_cases(rank, world_size, seed):
    import torch.distributed as dist

    assert dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device())
    return [run_case(case, rank, world_size, seed + i, device)
            for i, case in enumerate(GPU_CASES)]


def compiled_matches_eager(rank, world_size):
    """torch.compile (aot_eager) of a step around ring and Ulysses attention gives the eager
    result and gradients (the host-side planning runs outside the graph)."""
    from flashcpp import distributed as cp

    g = torch.Generator().manual_seed(11)
    shard = cp.shard_sequence(torch.randn(1, 8 * world_size, 2, 16, generator=g), rank,
                              world_size)
    for attend in (cp.ring_attention, cp.ulysses_attention):
        def step(x):
            y = 2 * x
            return attend(y, y, y, causal=True)

        eager_in, compiled_in = shard.clone().requires_grad_(), shard.clone().requires_grad_()
        eager = step(eager_in)
        eager.sum().backward()
        compiled = torch.compile(step, backend="aot_eager")(compiled_in)
        compiled.sum().backward()
        torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
        torch.testing.assert_close(compiled_in.grad, eager_in.grad, rtol=0, atol=0)
    return "compiled"


def random_cases(seed):
    """Two cases of random shape and options (the same on every rank: seeded)."""
    import random

    pick = random.Random(seed)
    hkv = pick.choice([1, 2])
    options = dict(heads=(hkv * pick.choice([1, 2]), hkv), d=8 * pick.randint(1, 4),
                   causal=pick.random() < 0.6, layout=pick.choice(["zigzag", "contiguous"]),
                   window=pick.choice([(-1, -1), (pick.randint(0, 12), -1),
                                       (pick.randint(0, 6), pick.randint(0, 6))]))
    padded = dict(options, name="random", batch=pick.randint(1, 2), n=pick.randint(1, 40))
    lengths = [pick.randint(0, 20) for _ in range(pick.randint(1, 4))]
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    varlen = dict(options, name="random-varlen", cu=cu, total=cu[-1])
    return [padded, varlen]


def subgroup_matches_single(rank, world_size):
    """Ring attention on a group of ranks 1 and 3 of four (the ring's neighbours are global
    ranks 3 and 1), with the other ranks idle."""
    import torch.distributed as dist

    import flashcpp.torch as fa
    from flashcpp import distributed as cp

    group = dist.new_group([1, 3])
    if rank not in (1, 3):
        return "idle"
    g = torch.Generator().manual_seed(17)
    q, k, v = (torch.randn(1, 22, 2, 16, generator=g, dtype=torch.float64).float()
               for _ in range(3))
    mine = dist.get_rank(group)
    out = cp.ring_attention(*(cp.shard_sequence(t, mine, 2) for t in (q, k, v)), group,
                            causal=True, window=(7, -1))
    gathered = cp.gather_sequence(out, group)
    single = fa.attention(q, k, v, causal=True, window=(7, -1))
    exact = exact_attention(q, k, v, causal=True, window=(7, -1))
    check_close(gathered, single, exact, torch.float32, "subgroup out")
    return "subgroup"


def run_cases(rank, world_size, seed):
    cases = CASES + random_cases(seed)
    names = [run_case(case, rank, world_size, seed + i) for i, case in enumerate(cases)]
    if world_size == 2:  # once is enough: compiling costs seconds
        names.append(compiled_matches_eager(rank, world_size))
    if world_size == 4:
        names.append(subgroup_matches_single(rank, world_size))
    return names


def raise_on_last_rank(rank, world_size, linger_s=0.0):
    """The last rank fails before attention; the others must give up, not hang."""
    from flashcpp import distributed as cp

    if rank == world_size - 1:
        time.sleep(linger_s)  # alive but absent: the others must time out, not wait forever
        raise RuntimeError("this rank fails on purpose")
    x = torch.randn(1, 8 * world_size, 2, 16)
    shard = cp.shard_sequence(x, rank, world_size)
    cp.ring_attention(shard, shard, shard, causal=True)
    return "finished"
