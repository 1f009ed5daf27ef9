"""Varlen side by side: a packed batch of random lengths against the equal-length batch of the
same tokens, in one process on one GPU.

    python bench/varlen_compare.py [--tokens 16384] [--dims 64,128,256] [--hidden 2048]
                                   [--lengths 128:4096] [--equal-len 2048] [--seed 0]

Per head dim (heads = hidden / D), causal and not, forward and backward, rows of:
  flashcpp varlen   attention_varlen over the packed batch (lengths drawn uniformly from
                    --lengths until they sum to --tokens; the last one takes what is left)
  flashcpp equal    attention over [tokens / equal_len, equal_len, H, D]
  cudnn equal       torch SDPA's cuDNN backend over the same equal-length batch
TFLOP/s count the visible (query, key) pairs of each sequence (causal: bottom-right aligned),
4 * D FLOPs per pair forward, 2.5 x that backward; the varlen row's ratios are to its own
equal-length flashcpp run and to cuDNN's. Timing: bench/timing.py (interleaved rounds, medians).
"""
from __future__ import annotations

import argparse
import os
import random
import sys
from typing import List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timing  # noqa: E402


def draw_lengths(tokens: int, lo: int, hi: int, seed: int) -> List[int]:
    rng = random.Random(seed)
    lengths: List[int] = []
    while sum(lengths) < tokens:
        lengths.append(min(rng.randint(lo, hi), tokens - sum(lengths)))
    return lengths


def visible_pairs(lq: int, lk: int, causal: bool) -> int:
    if not causal:
        return lq * lk
    # bottom-right: query i sees keys j <= i + lk - lq
    return sum(max(0, min(lk, i + lk - lq + 1)) for i in range(lq))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--lengths", default="128:4096")
    ap.add_argument("--equal-len", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--modes", default="fwd,bwd")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args(argv)

    import torch  # noqa: PLC0415
    import flashcpp  # noqa: PLC0415
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415

    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    lo, hi = (int(x) for x in a.lengths.split(":"))
    lengths = draw_lengths(a.tokens, lo, hi, a.seed)
    print(f"# {torch.cuda.get_device_name()}  {a.dtype}  tokens {a.tokens}  lengths "
          f"{lengths}  equal {a.tokens // a.equal_len} x {a.equal_len}")
    cu = torch.tensor([0] + [sum(lengths[:i + 1]) for i in range(len(lengths))],
                      dtype=torch.int32, device="cuda")
    print(f"{'D':>4} {'mask':>6} {'mode':>4} {'varlen':>8} {'equal':>8} {'cudnn':>8} "
          f"{'v/equal':>8} {'v/cudnn':>8}  kernel")
    for d in (int(x) for x in a.dims.split(",")):
        h = a.hidden // d
        gen = torch.Generator(device="cuda").manual_seed(a.seed)
        qkv = torch.randn(3, a.tokens, h, d, device="cuda", dtype=dtype, generator=gen)
        dout = torch.randn(a.tokens, h, d, device="cuda", dtype=dtype, generator=gen)
        b_eq = a.tokens // a.equal_len
        eq = [t.view(b_eq, a.equal_len, h, d) for t in (*qkv, dout)]
        eq_bhsd = [t.transpose(1, 2) for t in eq]
        for causal in (False, True):
            kw = dict(causal=causal)
            out_v, lse_v = flashcpp.attention_varlen(*qkv, cu, cu, max(lengths), max(lengths),
                                                     return_lse=True, **kw)
            kernel = flashcpp.last_run_info()
            out_e, lse_e = flashcpp.attention(*eq[:3], return_lse=True, **kw)
            pairs_v = sum(visible_pairs(n, n, causal) for n in lengths)
            pairs_e = b_eq * visible_pairs(a.equal_len, a.equal_len, causal)

            def sdpa_fwd(i, causal=causal):
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return torch.nn.functional.scaled_dot_product_attention(
                        *eq_bhsd[:3], is_causal=causal)

            fns = {}
            for mode in a.modes.split(","):
                if mode == "fwd":
                    fns = {
                        "varlen": lambda i: flashcpp.attention_varlen(
                            *qkv, cu, cu, max(lengths), max(lengths), **kw),
                        "equal": lambda i: flashcpp.attention(*eq[:3], **kw),
                        "cudnn": sdpa_fwd,
                    }
                    scale = 1.0
                else:
                    leaves = [t.detach().requires_grad_() for t in eq_bhsd[:3]]
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        o_sdpa = torch.nn.functional.scaled_dot_product_attention(
                            *leaves, is_causal=causal)
                    fns = {
                        "varlen": lambda i: flashcpp.attention_varlen_backward(
                            dout, *qkv, out_v, lse_v, cu, cu, max(lengths), max(lengths), **kw),
                        "equal": lambda i: flashcpp.attention_backward(
                            eq[3], *eq[:3], out_e, lse_e, **kw),
                        "cudnn": lambda i, o=o_sdpa, lv=leaves: torch.autograd.grad(
                            o, lv, eq_bhsd[3], retain_graph=True),
                    }
                    scale = 2.5
                    kernel = None
                res = timing.time_interleaved(fns, reps=a.reps, rounds=a.rounds)
                if kernel is None:
                    fns["varlen"](0)
                    kernel = flashcpp.last_run_info()

                def tf(name, pairs):
                    r = res[name]
                    if isinstance(r, BaseException):
                        return float("nan")
                    return scale * 4.0 * d * h * pairs / (r["median"] * 1e-3) / 1e12
                tv, te, tc = tf("varlen", pairs_v), tf("equal", pairs_e), tf("cudnn", pairs_e)
                info = f"{kernel.backend} {kernel.kernel}" if kernel else ""
                print(f"{d:>4} {'causal' if causal else 'none':>6} {mode:>4} {tv:8.1f} {te:8.1f} "
                      f"{tc:8.1f} {tv / te:8.3f} {tv / tc:8.3f}  {info}", flush=True)
                kernel = None
    return 0


if __name__ == "__main__":
    sys.exit(main())
