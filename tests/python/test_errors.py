"""C++ validation errors arrive as flashcpp.Error (a ValueError) carrying the C++ message; Python
values of the wrong kind raise TypeError."""

import numpy as np
import pytest

import flashcpp


def qkv(shape=(1, 8, 2, 32), dtype=np.float32):
    rng = np.random.default_rng(0)
    return tuple(rng.standard_normal(shape).astype(dtype) for _ in range(3))


def test_error_is_a_value_error():
    assert issubclass(flashcpp.Error, ValueError)


@pytest.mark.parametrize(
    "make_args, message",
    [
        (lambda q, k, v: (q, k[..., :16], v), r"k: expected head dim 32 \(same as q\)"),
        (lambda q, k, v: (q[..., :20], k[..., :20], v), r"q: head dim 20 is not supported"),
        (lambda q, k, v: (np.concatenate([q] * 3, axis=2), np.concatenate([k] * 2, axis=2),
                          np.concatenate([v] * 2, axis=2)),
         r"num_heads_q \(6\) must be a multiple of num_heads_kv \(4\)"),
        (lambda q, k, v: (q, k.astype(np.float16), v),
         r"k: expected dtype fp16 \(same as q\), got|k: expected dtype fp32 \(same as q\), got fp16"),
        (lambda q, k, v: (q[0], k[0], v[0]), r"q: expected 4 dimensions"),
        (lambda q, k, v: (q[..., ::2], k[..., ::2], v[..., ::2]), r"last dimension must have stride 1"),
    ],
    ids=["head-dim-mismatch", "head-dim-unsupported", "heads-multiple", "dtype-mismatch", "rank",
         "last-stride"],
)
def test_cpp_messages_surface_as_value_error(make_args, message):
    with pytest.raises(ValueError, match=message):
        flashcpp.attention(*make_args(*qkv()))


def test_options_are_validated():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="softcap: must be >= 0"):
        flashcpp.attention(q, k, v, softcap=-1.0)
    with pytest.raises(ValueError, match="window_left: must be -1"):
        flashcpp.attention(q, k, v, window=(-3, 0))
    with pytest.raises(ValueError, match="backend: expected one of auto, cpu"):
        flashcpp.attention(q, k, v, backend="tpu")


def test_cuda_backend_on_cpu_tensors_is_refused():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="q is on cpu but the cuda_sm90 backend was selected"):
        flashcpp.attention(q, k, v, backend="cuda_sm90")


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda q, k, v: flashcpp.attention([[1.0]], k, v), r"q: expected an array or tensor .* got list"),
        (lambda q, k, v: flashcpp.attention(q, "k", v), r"k: expected an array or tensor .* got str"),
        (lambda q, k, v: flashcpp.attention(q.astype(np.float64), k, v), r"q: dtype float64 is not supported"),
        (lambda q, k, v: flashcpp.attention(q.astype(np.int64), k, v), r"q: dtype int64 is not supported"),
        (lambda q, k, v: flashcpp.attention(q, k, v, window=3), r"window: expected a pair"),
        (lambda q, k, v: flashcpp.attention(q, k, v, backend=1), r"backend: expected a str"),
        (lambda q, k, v: flashcpp.attention(q, k, v, stream="s"), r"stream: expected an int"),
    ],
    ids=["list", "str", "float64", "int64", "window", "backend", "stream"],
)
def test_wrong_python_types_raise_type_error(call, message):
    with pytest.raises(TypeError, match=message):
        call(*qkv())


def test_read_only_output_is_refused():
    q, k, v = qkv()
    out = np.empty_like(q)
    out.setflags(write=False)
    with pytest.raises(ValueError, match="out: array is read-only"):
        flashcpp.attention(q, k, v, out=out)


def test_read_only_inputs_are_fine():
    q, k, v = qkv()
    for t in (q, k, v):
        t.setflags(write=False)
    assert np.isfinite(flashcpp.attention(q, k, v)).all()


def test_varlen_offsets_are_checked():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((10, 2, 32)).astype(np.float32)
    good = np.array([0, 4, 10], np.int32)
    with pytest.raises(ValueError, match=r"cu_seqlens_q: must be non-decreasing"):
        flashcpp.attention_varlen(q, q, q, np.array([0, 6, 4], np.int32), good, 10, 10)
    with pytest.raises(ValueError, match=r"max_seqlen_k \(3\) is smaller than sequence"):
        flashcpp.attention_varlen(q, q, q, good, good, 10, 3)
    with pytest.raises(TypeError, match=r"cu_seqlens_q: dtype int64 is not supported"):
        flashcpp.attention_varlen(q, q, q, good.astype(np.int64), good, 10, 10)
    with pytest.raises(ValueError, match=r"cu_seqlens_q: expected dtype int32, got fp32"):
        flashcpp.attention_varlen(q, q, q, good.astype(np.float32), good, 10, 10)


def test_backward_requires_matching_shapes():
    q, k, v = qkv()
    out, lse = flashcpp.attention(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match=r"dout: expected shape \[1, 8, 2, 32\] \(same as out\)"):
        flashcpp.attention_backward(out[:, :4], q, k, v, out, lse)
    with pytest.raises(ValueError, match=r"lse: expected dtype fp32"):
        flashcpp.attention_backward(out, q, k, v, out, lse.astype(np.float16))
