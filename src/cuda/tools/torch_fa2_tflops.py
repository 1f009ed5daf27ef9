# PyTorch's FLASH_ATTENTION SDPA backend on the shapes of fwd_tflops.cu (bf16, H=2048/D,
# B=16384/N, N from FLASHCPP_PROBE_N (default 4096), D in {64,128,256}, causal and not): CUDA
# events, median of 30 runs after 5 warm-ups.
import os

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F


def time_case(B, H, N, D, causal):
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        for _ in range(5):
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        times = []
        for _ in range(30):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


print("impl,N,D,causal,ms,tflops")
for N in [int(n) for n in os.environ.get("FLASHCPP_PROBE_N", "4096").split(",")]:
    B = 16384 // N
    for D in (64, 128, 256):
        for causal in (False, True):
            H = 2048 // D
            ms = time_case(B, H, N, D, causal)
            flops = 4 * B * H * N * N * D * (0.5 if causal else 1.0)
            print(f"torch_flash,{N},{D},{int(causal)},{ms:.4f},{flops / (ms * 1e-3) / 1e12:.1f}")
