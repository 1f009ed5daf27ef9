"""Times PyTorch's cuDNN and FlashAttention-2 SDPA backends on the training-shape grid (bf16,
D in {64, 128, 256}, N in {4096, 16384}, B = 16384 / N, H = 2048 / D, causal off/on) in one
process and prints one line per (backend, case):
    peer <name> D=<d> N=<n> causal=<0|1> ms=<median> tflops=<t>
FLOPs: 4 * B * H * N * N * D, halved for causal (BENCH.md). CUDA events, median of --reps."""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ap = argparse.ArgumentParser()
ap.add_argument("--reps", type=int, default=30)
a = ap.parse_args()
for d in (64, 128, 256):
    for n in (4096, 16384):
        for causal in (0, 1):
            B, H = 16384 // n, 2048 // d
            torch.manual_seed(0)
            q, k, v = (torch.randn(B, H, n, d, device="cuda", dtype=torch.bfloat16)
                       for _ in range(3))
            flops = 4 * B * H * n * n * d / (2 if causal else 1)
            for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION),
                                  ("fa2", SDPBackend.FLASH_ATTENTION)):
                try:
                    with sdpa_kernel([backend]):
                        def f():
                            return F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
                        for _ in range(5):
                            f()
                        times = []
                        for _ in range(a.reps):
                            s = torch.cuda.Event(enable_timing=True)
                            e = torch.cuda.Event(enable_timing=True)
                            s.record()
                            f()
                            e.record()
                            e.synchronize()
                            times.append(s.elapsed_time(e))
                    ms = sorted(times)[len(times) // 2]
                    print(f"peer {name} D={d} N={n} causal={causal} ms={ms:.4f} "
                          f"tflops={flops / ms / 1e9:.1f}", flush=True)
                except Exception as ex:  # a backend that refuses the shape
                    print(f"peer {name} D={d} N={n} causal={causal} error={type(ex).__name__}",
                          flush=True)
