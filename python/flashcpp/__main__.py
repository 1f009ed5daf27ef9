"""python -m flashcpp: what this installation holds and which kernel serves a shape.

    python -m flashcpp                                  # version, build, driver, GPUs
    python -m flashcpp --explain 2 4096 32 128 --hkv 8 --causal
"""

from __future__ import annotations

import argparse
import platform
import sys

import flashcpp

from . import _build_info, _driver


def _framework_versions() -> str:
    found = []
    for name in ("numpy", "torch", "jax"):
        try:
            module = __import__(name)
        except ImportError:
            continue
        text = f"{name} {module.__version__}"
        if name == "torch" and module.version.cuda:
            text += f" (CUDA {module.version.cuda})"
        found.append(text)
    return ", ".join(found) or "no numpy, torch or jax"


def report() -> None:
    info = _build_info
    print(f"flashcpp {flashcpp.__version__} (git {info.git_revision}) at "
          f"{flashcpp.__file__.rsplit('/', 1)[0]}")
    print(f"python   {platform.python_version()}; {_framework_versions()}")
    if info.cuda:
        print(f"kernels  CUDA {', '.join('sm' + a for a in info.cuda_archs)}; head dims "
              f"{', '.join(map(str, info.head_dims))} (a smaller head dim runs on the next "
              f"larger kernel); {', '.join(info.dtypes)}")
        if info.head_dim_pairs:
            print(f"         sm90a D x Dv pairs {', '.join(info.head_dim_pairs)} (D != Dv)")
        runtime = ("linked statically: needs only the driver"
                   if info.cuda_runtime_linking == "static" else "a shared library (libcudart)")
        print(f"cuda     toolkit {info.cuda_toolkit}; runtime {runtime}")
    else:
        print("kernels  CPU backend only (built without CUDA: FLASHCPP_CUDA=1 pip install .)")
    if info.xla_ffi:
        print(f"jax      XLA FFI handlers (flashcpp.jax under jit, grad, vmap), built against "
              f"{info.xla_ffi_headers}")
    else:
        print("jax      no XLA FFI handlers: concrete JAX arrays only (docs/python.md, JAX)")
    driver = _driver.report()
    if driver.problem:
        print(f"driver   {driver.problem}")
    else:
        print(f"driver   {driver.driver_version or 'version unknown (no NVML)'}, "
              f"supports CUDA {driver.cuda_version}")
    for gpu in driver.gpus:
        print(f"gpu {gpu.index}    {gpu.name}, sm {gpu.compute_capability}, "
              f"{gpu.multiprocessors} SMs, {gpu.memory_gib:.0f} GiB")
    print(f"ready    cuda_available() = {flashcpp.cuda_available()}")


def _tensors(args):
    """q, k, v of the shape asked for, on the GPU (torch) when flashcpp can use one, else on
    the host (torch or numpy)."""
    b, n, h, d = args.shape
    nk, hkv, dv = args.nk or n, args.hkv or h, args.dv or d
    shapes = ((b, n, h, d), (b, nk, hkv, d), (b, nk, hkv, dv))
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        cuda = torch.cuda.is_available() and flashcpp.cuda_available()
        dtype = getattr(torch, {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}[
            args.dtype or ("bf16" if cuda else "fp32")])
        device = "cuda" if cuda else "cpu"
        where = torch.cuda.get_device_name() if cuda else "the CPU"
        return [torch.randn(s, dtype=dtype, device=device) for s in shapes], where
    import numpy as np

    dtype = {"fp16": np.float16, "fp32": np.float32, None: np.float32}.get(args.dtype)
    if dtype is None:
        sys.exit("--dtype bf16 needs torch (numpy has no bfloat16)")
    rng = np.random.default_rng(0)
    return [rng.standard_normal(s).astype(dtype) for s in shapes], "the CPU"


def _describe(run) -> str:
    return f"{run.backend} {run.kernel} (splits {run.num_splits})"


def explain(args) -> None:
    (q, k, v), where = _tensors(args)
    options = dict(causal=args.causal, window=tuple(args.window), softcap=args.softcap,
                   backend=args.backend)
    print(f"B={q.shape[0]} Nq={q.shape[1]} Nk={k.shape[1]} Hq={q.shape[2]} Hkv={k.shape[2]} "
          f"D={q.shape[3]} Dv={v.shape[3]} {str(q.dtype).replace('torch.', '')} "
          f"causal={args.causal} window={tuple(args.window)} softcap={args.softcap} "
          f"on {where}")
    out, lse = flashcpp.attention(q, k, v, return_lse=True, **options)
    print(f"forward   {_describe(flashcpp.last_run_info())}")
    try:
        flashcpp.attention_backward(out, q, k, v, out, lse, deterministic=args.deterministic,
                                    **options)
        print(f"backward  {_describe(flashcpp.last_run_info())}")
    except flashcpp.Error as error:
        print(f"backward  not served: {error}")
    try:
        flashcpp.attention_with_kvcache(q[:, -1:], k, v, cache_seqlens=k.shape[1] - 1,
                                        causal=args.causal, window_size=tuple(args.window),
                                        softcap=args.softcap, backend=args.backend)
        print(f"decode    {_describe(flashcpp.last_run_info())}  (1 new token, "
              f"{k.shape[1] - 1} cached keys)")
    except flashcpp.Error as error:
        print(f"decode    not served: {error}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m flashcpp",
        description="Report flashcpp's build, the driver and the GPUs; with --explain, run "
                    "one forward, backward and decode step of a shape and say which kernel "
                    "served each (FLASHCPP_LOG=info logs every kernel choice of a program).")
    parser.add_argument("--explain", nargs=4, type=int, metavar=("B", "N", "H", "D"),
                        dest="shape", help="batch, sequence length, query heads, head dim")
    parser.add_argument("--nk", type=int, help="key sequence length (default N)")
    parser.add_argument("--hkv", type=int, help="key/value heads (default H)")
    parser.add_argument("--dv", type=int, help="value head dim (default D)")
    parser.add_argument("--dtype", choices=("fp16", "bf16", "fp32"),
                        help="default bf16 on the GPU, fp32 on the CPU")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--window", nargs=2, type=int, default=(-1, -1),
                        metavar=("LEFT", "RIGHT"))
    parser.add_argument("--softcap", type=float, default=0.0)
    parser.add_argument("--deterministic", action="store_true",
                        help="the deterministic backward")
    parser.add_argument("--backend", default="auto",
                        help="auto, cpu, cpu_reference, cuda_sm80, cuda_sm90")
    args = parser.parse_args(argv)
    if args.shape:
        explain(args)
    else:
        report()


if __name__ == "__main__":
    main()
