"""CUDA C++ compiled at run time with NVRTC and launched on torch's current stream through the
driver API, both through ctypes: no compiler, build step or extra package on the user's machine
(PyTorch's CUDA wheels ship libnvrtc; the driver ships libcuda). Launches are plain kernel launches,
so CUDA graph capture records them like any other.

`compile_cubin(source, name, defines)` -> a `Kernel` (one per device, source and defines, cached in
the process); `Kernel.launch(grid, block, smem, params)` with `params` a ctypes Structure passed by
value as the kernel's single argument."""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import hashlib
import os
import sys
import threading

import torch
from dustin_kernels._util import KernelArgumentError

_LOCK = threading.Lock()
_NVRTC = None
_CUDA = None
_KERNELS: dict = {}
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8


class CudaJitError(RuntimeError):
    """NVRTC or the driver refused: the message holds the compiler log or the driver's error."""


def _nvrtc_candidates() -> list[str]:
    found = []
    for base in sys.path:
        if base and os.path.isdir(os.path.join(base, "nvidia")):
            found += glob.glob(os.path.join(base, "nvidia", "**", "libnvrtc.so*"), recursive=True)
    found += glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libnvrtc*.so*"))
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    found += glob.glob(os.path.join(home, "lib64", "libnvrtc.so*"))
    lib = ctypes.util.find_library("nvrtc")
    if lib:
        found.append(lib)
    found = [f for f in found if "builtins" not in os.path.basename(f)]
    major = (torch.version.cuda or "0").split(".")[0]
    # the one built for torch's CUDA major version first
    return sorted(dict.fromkeys(found), key=lambda f: (f".so.{major}" not in f, f))


def _nvrtc():
    global _NVRTC
    if _NVRTC is None:
        errors = []
        for path in _nvrtc_candidates():
            try:
                lib = ctypes.CDLL(path)
                lib.nvrtcGetErrorString.restype = ctypes.c_char_p
                _NVRTC = lib
                break
            except OSError as e:
                errors.append(f"{path}: {e}")
        if _NVRTC is None:
            raise CudaJitError("NVRTC (libnvrtc) was not found; install PyTorch's CUDA wheel or a CUDA toolkit"
                               + (f" ({'; '.join(errors)})" if errors else ""))
    return _NVRTC


def _cuda():
    global _CUDA
    if _CUDA is None:
        try:
            _CUDA = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise CudaJitError(f"the CUDA driver library (libcuda.so.1) did not load: {e}") from e
    return _CUDA


def _check_nvrtc(res: int, what: str) -> None:
    if res != 0:
        raise CudaJitError(f"NVRTC {what}: {_nvrtc().nvrtcGetErrorString(res).decode()}")


def _check_cu(res: int, what: str) -> None:
    if res != 0:
        msg = ctypes.c_char_p()
        _cuda().cuGetErrorString(res, ctypes.byref(msg))
        raise CudaJitError(f"CUDA driver {what}: error {res} ({(msg.value or b'?').decode()})")


def nvrtc_compile(source: str, name: str, options: list[str]) -> bytes:
    """source -> cubin bytes (the compiler's log in the error when it fails)."""
    lib = _nvrtc()
    prog = ctypes.c_void_p()
    _check_nvrtc(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None), "create")
    try:
        opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
        res = lib.nvrtcCompileProgram(prog, len(options), opts)
        if res != 0:
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(prog, log)
            raise CudaJitError(f"NVRTC compile of {name} failed:\n{log.value.decode(errors='replace')}")
        size = ctypes.c_size_t()
        _check_nvrtc(lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "cubin size")
        buf = ctypes.create_string_buffer(size.value)
        _check_nvrtc(lib.nvrtcGetCUBIN(prog, buf), "cubin")
        return buf.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


class Kernel:
    """One compiled kernel on one device."""

    def __init__(self, cubin: bytes, entry: str, device: torch.device):
        self.device = device
        cu = _cuda()
        self._image = ctypes.create_string_buffer(cubin, len(cubin))  # kept alive with the module
        self.module, self.func = ctypes.c_void_p(), ctypes.c_void_p()
        with torch.cuda.device(device):
            torch.cuda.current_stream(device)  # the primary context is current on this thread
            _check_cu(cu.cuModuleLoadData(ctypes.byref(self.module), self._image), "module load")
            _check_cu(cu.cuModuleGetFunction(ctypes.byref(self.func), self.module, entry.encode()), "get function")
        self.smem_limit = 0

    def launch(self, grid: int, block: int, smem: int, params: ctypes.Structure) -> None:
        cu = _cuda()
        if smem > self.smem_limit:
            _check_cu(cu.cuFuncSetAttribute(self.func, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                            ctypes.c_int(smem)), "shared memory attribute")
            self.smem_limit = smem
        stream = ctypes.c_void_p(torch.cuda.current_stream(self.device).cuda_stream)
        args = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.pointer(params), ctypes.c_void_p))
        _check_cu(cu.cuLaunchKernel(self.func, ctypes.c_uint(grid), ctypes.c_uint(1), ctypes.c_uint(1),
                                    ctypes.c_uint(block), ctypes.c_uint(1), ctypes.c_uint(1),
                                    ctypes.c_uint(smem), stream, args, None), "launch")


def kernel(source: str, entry: str, defines: dict, device: torch.device) -> Kernel:
    """The compiled `entry` of `source` with `-D` defines for `device` (compiled once per process)."""
    if device.type != "cuda":
        raise KernelArgumentError(f"CUDA kernels need a CUDA device, got {device}")
    major, minor = torch.cuda.get_device_capability(device)
    opts = [f"--gpu-architecture=sm_{major}{minor}", "--std=c++17"]
    opts += [f"-D{k}={int(v)}" for k, v in sorted(defines.items())]
    key = (hashlib.sha256(source.encode()).hexdigest(), entry, tuple(opts), device.index)
    with _LOCK:
        k = _KERNELS.get(key)
        if k is None:
            if torch.cuda.is_current_stream_capturing():
                raise KernelArgumentError("dustin_kernels: run each kernel once before CUDA graph capture (warm-up)")
            k = _KERNELS[key] = Kernel(nvrtc_compile(source, entry, opts), entry, device)
        return k
