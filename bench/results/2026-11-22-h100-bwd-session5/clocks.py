# Sustained-loop timing with SM clock and power sampling: flashcpp vs cuDNN backward, one shape.
import subprocess, sys, time, threading, statistics
import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import flashcpp
D = int(sys.argv[1]); N = int(sys.argv[2]); B = int(sys.argv[3]); H = int(sys.argv[4])
dt = torch.bfloat16
q, k, v, do = (torch.randn(B, N, H, D, device="cuda", dtype=dt) for _ in range(4))
out, lse = flashcpp.attention(q, k, v, return_lse=True)
def fc():
    return flashcpp.attention_backward(do, q, k, v, out, lse)
ql, kl, vl = (t.transpose(1, 2).detach().requires_grad_(True) for t in (q, k, v))
with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
    o2 = F.scaled_dot_product_attention(ql, kl, vl)
do2 = do.transpose(1, 2)
def cd():
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return torch.autograd.grad(o2, (ql, kl, vl), do2, retain_graph=True)
samples = []
stop = False
def sampler():
    while not stop:
        r = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active", "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout.strip()
        samples.append((time.time(), r)); time.sleep(0.05)
th = threading.Thread(target=sampler); th.start()
for rnd in range(2):
    for name, fn in (("flashcpp", fc), ("cudnn", cd)):
        for _ in range(5): fn()
        torch.cuda.synchronize()
        t0 = time.time(); e0 = torch.cuda.Event(enable_timing=True); e1 = torch.cuda.Event(enable_timing=True)
        n = 0; e0.record()
        while time.time() - t0 < 2.0:
            for _ in range(10): fn()
            n += 10
            torch.cuda.synchronize()
        e1.record(); torch.cuda.synchronize(); t1 = time.time()
        ms = e0.elapsed_time(e1) / n
        sel = [s[1] for s in samples if t0 + 0.3 < s[0] < t1]
        clk = [float(s.split(",")[0]) for s in sel]; pw = [float(s.split(",")[1]) for s in sel]
        reasons = sorted(set(s.split(",")[3].strip() for s in sel))
        print(f"D{D} N{N} {name:9s} {ms:.3f} ms/call  sm clock median {statistics.median(clk):.0f} MHz (min {min(clk):.0f})  power median {statistics.median(pw):.0f} W  throttle {reasons}", flush=True)
stop = True; th.join()
