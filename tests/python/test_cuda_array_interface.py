"""__cuda_array_interface__ version 3: flashcpp orders its launch after the producer's stream.

The wiring is checked everywhere with fake device arrays and a stand-in for the native module
(nothing touches memory); the real cross-stream wait runs on a GPU with PyTorch."""

import ctypes

import numpy as np
import pytest

import flashcpp
from flashcpp import _frameworks, _native

ABSENT = object()


class CaiArray:
    """A device array known only through __cuda_array_interface__ (as a Numba array is)."""

    def __init__(self, shape, stream=ABSENT, typestr="<f2", pointer=0x7F00_0000_0000, version=3):
        self.shape = tuple(shape)
        cai = dict(shape=self.shape, typestr=typestr, data=(pointer, False), strides=None,
                   version=version)
        if stream is not ABSENT:
            cai["stream"] = stream
        self.__cuda_array_interface__ = cai

    @classmethod
    def of(cls, tensor, stream):
        """A view of a torch CUDA tensor's memory that names `stream` as its producer's."""
        array = cls(tensor.shape, stream)
        array.__cuda_array_interface__ = dict(tensor.__cuda_array_interface__, stream=stream)
        array.keep = tensor
        return array


class FakeNative:
    """Stands in for flashcpp._C: records launches (and their stream), reads nothing."""

    def __init__(self, log):
        self.log = log
        self.Error = flashcpp.Error

    def forward_workspace_size(self, *args, **kwargs):
        return 0

    backward_workspace_size = forward_workspace_size

    def forward(self, *args, stream, **kwargs):
        self.log.append(("forward", stream))
        return ("cuda_sm90", "fake", 1)

    def backward(self, *args, stream, **kwargs):
        self.log.append(("backward", stream))
        return ("cuda_sm80", "fake", 1)


@pytest.fixture
def log(monkeypatch):
    events = []
    monkeypatch.setattr(_native, "_C", FakeNative(events))
    monkeypatch.setattr(_frameworks, "stream_waiter",
                        lambda launch, producer, pointer: events.append(
                            ("wait", launch, producer, pointer)))
    return events


def qkv(streams, pointers=(0x1000, 0x2000, 0x3000)):
    return [CaiArray((1, 8, 2, 16), s, pointer=p) for s, p in zip(streams, pointers)]


def test_stream_entry():
    get = _frameworks.cuda_array_interface_stream
    assert get(CaiArray((2,), 1234), "q") == 1234
    assert get(CaiArray((2,), 1), "q") == 1 and get(CaiArray((2,), 2), "q") == 2
    assert get(CaiArray((2,), None), "q") is None
    assert get(CaiArray((2,)), "q") is None
    assert get(CaiArray((2,), version=2), "q") is None
    assert get(np.zeros(2), "q") is None
    with pytest.raises(flashcpp.Error, match="k: __cuda_array_interface__ stream 0 is disallowed"):
        get(CaiArray((2,), 0), "k")
    with pytest.raises(TypeError, match="must be an int or None"):
        get(CaiArray((2,), "7"), "q")

    class WithDlpack(CaiArray):  # read through DLPack by the native module: CAI not consulted
        def __dlpack__(self, stream=None):
            raise AssertionError("not called")

    assert get(WithDlpack((2,), 0), "q") is None


def test_forward_waits_for_each_other_producer_stream_then_launches(log):
    q, k, v = qkv((11, 11, 12))
    out = CaiArray((1, 8, 2, 16), 13, pointer=0x4000)
    flashcpp.attention(q, k, v, out=out, stream=11)
    # q and k are on the launch stream already; v and out each get one wait, before the launch
    assert log == [("wait", 11, 12, 0x3000), ("wait", 11, 13, 0x4000), ("forward", 11)]


def test_default_launch_stream_is_the_legacy_default_stream(log):
    # No framework stream for plain CAI arrays: flashcpp launches on stream 0 (legacy default),
    # which CAI spells 1; 12 is waited for once although two arrays name it; None needs nothing.
    q, k, v = qkv((1, 12, 12))
    flashcpp.attention(q, k, v, out=CaiArray((1, 8, 2, 16), None))
    assert log == [("wait", 0, 12, 0x2000), ("forward", 0)]


def test_backward_waits_for_inputs_and_preallocated_gradients(log):
    q, k, v = qkv((5, 5, 5))
    dout, out = CaiArray(q.shape, 6), CaiArray(q.shape, 5)
    lse = CaiArray((1, 2, 8), 5, typestr="<f4")
    dq, dk, dv = (CaiArray(q.shape, s, pointer=0x9000) for s in (5, 7, None))
    flashcpp.attention_backward(dout, q, k, v, out, lse, dq=dq, dk=dk, dv=dv, stream=5)
    assert log == [("wait", 5, 6, 0x7F00_0000_0000), ("wait", 5, 7, 0x9000), ("backward", 5)]


def test_stream_zero_is_refused_before_anything_runs(log):
    q, k, v = qkv((3, 0, 3))
    with pytest.raises(flashcpp.Error, match="k: __cuda_array_interface__ stream 0"):
        flashcpp.attention(q, k, v, out=CaiArray(q.shape))
    assert log == []


def test_numpy_calls_never_wait(log, rng):
    q = rng.standard_normal((1, 4, 1, 8)).astype(np.float32)
    flashcpp.attention(q, q, q, out=np.empty_like(q))
    assert log == [("forward", 0)]


# ---- the CUDA driver calls, against a stand-in for libcuda ------------------------------------
class FakeLibcuda:
    """Records driver calls; handle out-parameters get `handle`, results come from `fail`."""

    def __init__(self, current_context=0xC0, fail=None):
        self.calls, self.current_context, self.fail = [], current_context, fail or {}

    def __getattr__(self, name):
        def call(*args):
            self.calls.append((name, [getattr(a, "value", a) for a in args]))
            for a in args:
                target = getattr(a, "_obj", None)  # a ctypes.byref(...) out-parameter
                if isinstance(target, ctypes.c_void_p):
                    target.value = self.current_context if name == "cuCtxGetCurrent" else 0xE0
            return self.fail.get(name, 0)
        return call


def driver_with(lib):
    driver = _frameworks._CudaDriver.__new__(_frameworks._CudaDriver)
    driver.ctypes, driver.lib = ctypes, lib
    return driver


def test_driver_records_on_the_producer_and_waits_on_the_launch_stream():
    lib = FakeLibcuda()
    driver_with(lib)(0x5000, 0x6000, 0x1234)
    names = [name for name, _ in lib.calls]
    assert names == ["cuInit", "cuCtxGetCurrent", "cuStreamGetCtx", "cuCtxPushCurrent_v2",
                     "cuEventCreate", "cuEventRecord", "cuCtxPopCurrent_v2", "cuStreamWaitEvent",
                     "cuEventDestroy_v2"]
    args = dict(lib.calls)
    assert args["cuStreamGetCtx"][0] == 0x6000 and args["cuEventRecord"][1] == 0x6000
    assert args["cuStreamWaitEvent"][0] == 0x5000


def test_driver_makes_the_data_devices_primary_context_current_when_none_is():
    lib = FakeLibcuda(current_context=0)
    driver_with(lib)(0, 2, 0x1234)
    names = [name for name, _ in lib.calls]
    assert names[:6] == ["cuInit", "cuCtxGetCurrent", "cuPointerGetAttribute", "cuDeviceGet",
                         "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent"]
    assert dict(lib.calls)["cuPointerGetAttribute"][2] == 0x1234


def test_driver_errors_name_the_call():
    with pytest.raises(flashcpp.Error, match="cuStreamWaitEvent failed .CUresult 400."):
        driver_with(FakeLibcuda(fail={"cuStreamWaitEvent": 400}))(1, 0x6000, 0)


def test_missing_driver_is_a_clear_error(monkeypatch):
    def no_driver():
        raise OSError("libcuda.so.1: cannot open shared object file")
    monkeypatch.setattr(_frameworks, "_driver", None)
    monkeypatch.setattr(_frameworks, "_CudaDriver", no_driver)
    with pytest.raises(flashcpp.Error, match="CUDA driver library cannot be loaded"):
        _frameworks._driver_wait(0, 0x6000, 0)


# ---- on a GPU: the wait is real -------------------------------------------------------------
def _cuda_torch():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not (torch.cuda.is_available() and flashcpp.cuda_available()):
        pytest.skip("needs a CUDA GPU and flashcpp built with CUDA (FLASHCPP_CUDA=1)")
    return torch


@pytest.mark.parametrize("launch", ["other_stream", "default_stream"])
def test_cuda_kernel_sees_what_the_producer_stream_wrote(launch):
    torch = _cuda_torch()
    B, N, H, D = 2, 256, 4, 64
    sources = [torch.randn(B, N, H, D, device="cuda", dtype=torch.float16) for _ in range(3)]
    inputs = [torch.zeros_like(t) for t in sources]
    out = torch.full_like(sources[0], float("nan"))
    torch.cuda.synchronize()
    # PyTorch's side streams are non-blocking: the legacy default stream does not wait for
    # them by itself. The producer holds its stream ~50 ms before it writes the inputs, so a
    # launch that did not wait would read the zeros.
    producer = torch.cuda.Stream()
    with torch.cuda.stream(producer):
        torch.cuda._sleep(100_000_000)
        for dst, src in zip(inputs, sources):
            dst.copy_(src)
    kwargs = {"stream": torch.cuda.Stream()} if launch == "other_stream" else {}
    q, k, v = (CaiArray.of(t, producer.cuda_stream) for t in inputs)
    flashcpp.attention(q, k, v, out=CaiArray.of(out, None), num_splits=1, **kwargs)
    torch.cuda.synchronize()
    expected = torch.nn.functional.scaled_dot_product_attention(
        *(t.float().transpose(1, 2) for t in sources)).transpose(1, 2)
    # fp16 output: a few units of 2^-11 at |out| < 1; reading the zeros would be off by ~0.1
    assert (out.float() - expected).abs().max().item() < 1e-2
