"""flashcpp: exact attention (FlashAttention) from C++20/CUDA.

    import numpy as np, flashcpp
    q = k = v = np.random.randn(2, 128, 8, 64).astype(np.float32)   # [B, N, H, D]
    out = flashcpp.attention(q, k, v, causal=True)
    print(flashcpp.last_run_info())   # RunInfo(backend='cpu', kernel=..., num_splits=1)

flashcpp.attention_with_kvcache attends new tokens against a (paged) KV cache, as
FlashAttention's flash_attn_with_kvcache does.

Works on any tensor speaking DLPack or __cuda_array_interface__ (NumPy on the CPU backend,
PyTorch, CuPy, ...); outputs are allocated with the input's framework. PyTorch custom ops
(autograd, torch.compile, CUDA graphs) live in flashcpp.torch, JAX's jit/grad/vmap support
(XLA FFI custom calls) in flashcpp.jax, the Hugging Face transformers
attention backend in flashcpp.transformers, flash-attn's functions in flashcpp.compat,
attention over sequences split across GPUs (context parallelism) in flashcpp.distributed.
`python -m flashcpp` reports the build, the driver and the GPUs. See docs/python.md.
"""

from ._C import __version__, built_with_cuda
from ._api import (
    attention,
    attention_backward,
    attention_varlen,
    attention_varlen_backward,
    attention_with_kvcache,
    select_backend,
)
from ._native import Error, RunInfo, cuda_available, last_run_info

__all__ = [
    "Error",
    "RunInfo",
    "__version__",
    "attention",
    "attention_backward",
    "attention_varlen",
    "attention_varlen_backward",
    "attention_with_kvcache",
    "built_with_cuda",
    "cuda_available",
    "last_run_info",
    "select_backend",
]
