"""Issue 23's bad and extreme inputs through the Python package, one table row each: the error
(type and message, naming the argument) or the promised result. The C++ side of the same table
is tests/cpp/bad_input_test.cpp."""

import numpy as np
import pytest

import flashcpp

SHAPE = (1, 24, 1, 16)


def qkv(shape=SHAPE, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(shape).astype(np.float32) for _ in range(3))


class Cai:
    """A bare __cuda_array_interface__ producer with a chosen interface dict."""

    def __init__(self, interface):
        self.__cuda_array_interface__ = interface


def cai(**entries):
    interface = dict(shape=SHAPE, typestr="<f2", data=(0x7F00_0000_0000, False), version=3)
    interface.update(entries)
    return Cai({k: v for k, v in interface.items() if v is not None})


def with_cai_q(**entries):
    """A call whose q is a __cuda_array_interface__ producer (out given: nothing to allocate)."""
    _, k, v = qkv()
    return flashcpp.attention(cai(**entries), k, v, out=np.empty(SHAPE, np.float32))


def misstrided():
    """A float32 q [1, 24, 2, 16] whose heads are 130 bytes apart (not whole elements)."""
    buffer = np.zeros(24 * 260 + 64, dtype=np.uint8)
    return np.ndarray((1, 24, 2, 16), dtype=np.float32, buffer=buffer,
                      strides=(24 * 260, 260, 130, 4))


def keys_above_int32():
    q, _, _ = qkv()
    k = np.lib.stride_tricks.as_strided(np.zeros(16, np.float32), (1, 2**31, 1, 16),
                                        (0, 0, 0, 4))
    return flashcpp.attention(q, k, k)


def out_is_k():
    q, k, v = qkv()
    return flashcpp.attention(q, k, v, out=k)


def dk_dv_one_buffer():
    q, k, v = qkv()
    out, lse = flashcpp.attention(q, k, v, return_lse=True)
    dk = np.empty_like(k)
    return flashcpp.attention_backward(out, q, k, v, out, lse, dk=dk, dv=dk)


ERRORS = [
    # (issue item, call, exception type, message pattern)
    ("8", lambda: flashcpp.attention(np.float32(1.0), *qkv()[1:]), flashcpp.Error,
     r"^q: expected an array with dimensions"),
    ("8", lambda: flashcpp.attention(*qkv(), window=(2**31, 0)), flashcpp.Error,
     r"^window: \(2147483648, 0\) is outside the int32 range"),
    ("8", lambda: flashcpp.attention(*qkv(), num_splits=2**31), flashcpp.Error,
     r"^num_splits: 2147483648 is outside the int32 range"),
    ("8", lambda: flashcpp.attention_varlen(*(t[0] for t in qkv()), np.array([0, 24], np.int32),
                                           np.array([0, 24], np.int32), 2**31, 24),
     flashcpp.Error, r"^max_seqlen_q: 2147483648 is outside the int32 range"),
    ("8", lambda: flashcpp.attention(*qkv(), window=(1.5, 2)), TypeError,
     r"^window: expected an int, got \(1.5, 2\)"),
    # 1.0 == 1 and hash(1.0) == hash(1): the options cached for (1, 2) must not serve (1.0, 2)
    ("8", lambda: (flashcpp.attention(*qkv(), window=(1, 2)),
                   flashcpp.attention(*qkv(), window=(1.0, 2))), TypeError,
     r"^window: expected an int, got \(1.0, 2\)"),
    ("8", lambda: (flashcpp.attention(*qkv(), num_splits=1),
                   flashcpp.attention(*qkv(), num_splits=1.0)), TypeError,
     r"^num_splits: expected an int, got 1.0"),
    ("8", lambda: flashcpp.attention(misstrided(), *qkv()[1:]), flashcpp.Error,
     r"^q: stride of dimension 2 \(130 bytes\) is not a multiple of the element size \(4 bytes\)"),
    ("8", lambda: with_cai_q(data=None), TypeError,
     r"^q: __cuda_array_interface__ needs 'data' as a tuple"),
    ("8", lambda: with_cai_q(data=[0x7F00_0000_0000, False]), TypeError,
     r"^q: __cuda_array_interface__ needs 'data' as a tuple"),
    ("8", lambda: with_cai_q(typestr=">f4"), TypeError,
     r"^q: __cuda_array_interface__ typestr '>f4' is not supported"),
    ("8", lambda: flashcpp.select_backend(np.zeros((2, 2), np.float32)), flashcpp.Error,
     r"^q: expected 4 dimensions"),
    ("8", lambda: flashcpp.select_backend(qkv()[0], softcap=-1.0), flashcpp.Error,
     r"^softcap: must be >= 0"),
    ("8", keys_above_int32, flashcpp.Error, r"^k: 2147483648 keys exceed 2\^31 - 1"),
    ("4", out_is_k, flashcpp.Error, r"^out: overlaps k in memory"),
    ("4", dk_dv_one_buffer, flashcpp.Error, r"^dv: overlaps dk in memory"),
    ("5", lambda: flashcpp.attention(*qkv(), softcap=1e-40), flashcpp.Error,
     r"^softcap: softmax_scale / softcap"),
    ("5", lambda: flashcpp.attention(*qkv(), softmax_scale=1e38), flashcpp.Error,
     r"^q, k: scores overflow float32"),
]


@pytest.mark.parametrize("item, call, kind, message", ERRORS,
                         ids=[f"item{e[0]}-{i}" for i, e in enumerate(ERRORS)])
def test_bad_input_is_refused_naming_the_argument(item, call, kind, message):
    with pytest.raises(kind, match=message):
        call()


@pytest.mark.parametrize("backend", ["cpu", "cpu_reference"])
def test_nan_in_q_gives_nan_row(backend):
    q, k, v = qkv()
    q[0, 3, 0, 5] = np.nan
    out, lse = flashcpp.attention(q, k, v, return_lse=True, backend=backend)
    nan_rows = np.isnan(lse[0, 0])
    assert nan_rows.tolist() == [i == 3 for i in range(24)]
    assert np.isnan(out[0, 3]).all() and np.isfinite(np.delete(out[0], 3, axis=0)).all()


@pytest.mark.parametrize("backend", ["cpu", "cpu_reference"])
@pytest.mark.parametrize("which", ["k", "v"])
def test_nan_at_hidden_keys_contributes_nothing(backend, which):
    q, k, v = qkv()
    clean = {"k": k.copy(), "v": v.copy()}
    (k if which == "k" else v)[0, :10] = np.nan
    window = (4, 4)  # rows >= 14 see none of keys 0..9
    out, lse = flashcpp.attention(q, k, v, window=window, return_lse=True, backend=backend)
    ref, ref_lse = flashcpp.attention(q, clean["k"], clean["v"], window=window, return_lse=True,
                                      backend=backend)
    # Rows that see a NaN key are summed row by row: the same terms, maybe another order.
    np.testing.assert_allclose(out[0, 14:], ref[0, 14:], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(lse[0, :, 14:], ref_lse[0, :, 14:], rtol=1e-6, atol=1e-6)
    dout = np.ones_like(out)
    dq, dk, dv = flashcpp.attention_backward(dout, q, k, v, out, lse, window=window,
                                             backend=backend)
    assert np.isfinite(dq[0, 14:]).all()
    assert np.isfinite(dk[0, 18:]).all() and np.isfinite(dv[0, 18:]).all()


def test_varlen_rows_past_the_last_sequence_are_cleared():
    q, k, v = (t[0] for t in qkv())  # [24, 1, 16]; the sequences use 20 rows
    cu = np.array([0, 8, 20], np.int32)
    out, lse = flashcpp.attention_varlen(q, k, v, cu, cu, 12, 12, return_lse=True)
    assert (out[20:] == 0).all() and (lse[:, 20:] == -np.inf).all()
    dq, dk, dv = flashcpp.attention_varlen_backward(out, q, k, v, out, lse, cu, cu, 12, 12)
    assert (dq[20:] == 0).all() and (dk[20:] == 0).all() and (dv[20:] == 0).all()
