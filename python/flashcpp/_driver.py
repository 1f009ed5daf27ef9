"""What the NVIDIA driver reports: its version and the GPUs, read through ctypes from libcuda
and NVML (both ship with the driver), so no framework and no CUDA toolkit is needed."""

from __future__ import annotations

import ctypes
from typing import List, NamedTuple, Optional

# cuDeviceGetAttribute's CU_DEVICE_ATTRIBUTE_* numbers (cuda.h).
_MULTIPROCESSOR_COUNT = 16
_COMPUTE_CAPABILITY_MAJOR = 75
_COMPUTE_CAPABILITY_MINOR = 76


class Gpu(NamedTuple):
    index: int
    name: str
    compute_capability: str  # "9.0"
    multiprocessors: int
    memory_gib: float


class DriverReport(NamedTuple):
    driver_version: Optional[str]  # "575.57.08" (NVML), None when NVML is missing
    cuda_version: Optional[str]  # the newest CUDA the driver supports, "12.9"
    gpus: List[Gpu]
    problem: Optional[str]  # why nothing could be read, else None


def _nvml_driver_version() -> Optional[str]:
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    if nvml.nvmlInit_v2() != 0:
        return None
    try:
        buffer = ctypes.create_string_buffer(96)
        if nvml.nvmlSystemGetDriverVersion(buffer, len(buffer)) != 0:
            return None
        return buffer.value.decode()
    finally:
        nvml.nvmlShutdown()


def report() -> DriverReport:
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return DriverReport(None, None, [], "no NVIDIA driver (libcuda.so.1 not found)")
    status = cuda.cuInit(0)
    if status != 0:
        return DriverReport(_nvml_driver_version(), None, [],
                            f"the driver found no usable GPU (cuInit returned {status})")
    version = ctypes.c_int()
    cuda.cuDriverGetVersion(ctypes.byref(version))
    count = ctypes.c_int()
    cuda.cuDeviceGetCount(ctypes.byref(count))
    gpus = []
    for index in range(count.value):
        device = ctypes.c_int()
        cuda.cuDeviceGet(ctypes.byref(device), index)
        name = ctypes.create_string_buffer(256)
        cuda.cuDeviceGetName(name, len(name), device)
        values = []
        for attribute in (_COMPUTE_CAPABILITY_MAJOR, _COMPUTE_CAPABILITY_MINOR,
                          _MULTIPROCESSOR_COUNT):
            value = ctypes.c_int()
            cuda.cuDeviceGetAttribute(ctypes.byref(value), attribute, device)
            values.append(value.value)
        memory = ctypes.c_size_t()
        cuda.cuDeviceTotalMem_v2(ctypes.byref(memory), device)
        gpus.append(Gpu(index, name.value.decode(), f"{values[0]}.{values[1]}", values[2],
                        memory.value / 2**30))
    cuda_version = f"{version.value // 1000}.{version.value % 1000 // 10}"
    return DriverReport(_nvml_driver_version(), cuda_version, gpus, None)
