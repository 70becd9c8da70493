"""What a process pays the first time it uses each part of CUDA a leak
test touches, and again: run it in fresh processes on the GPU machine
(`for i in 1 2 3; do python3 cuda_first_use.py; done`). Milliseconds.
Figures in RESULTS.md ("What a CUDA test paid before its first iteration")."""
import ctypes
import time

import torch


def ms(f):
    start = time.perf_counter()
    f()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def main():
    parts = {}
    parts["CUDA's context (first tensor)"] = ms(lambda: torch.zeros(1, device="cuda"))
    parts["cuBLAS's handle and workspace, no kernel"] = ms(torch.cuda.current_blas_handle)
    parts["cuBLAS's handle again"] = ms(torch.cuda.current_blas_handle)
    w = torch.ones(16, 16, device="cuda", requires_grad=True)
    b = torch.zeros(16, device="cuda", requires_grad=True)
    x = torch.ones(16, 16, device="cuda")
    kept = {}
    parts["first linear with a bias (cuBLASLt, its kernel)"] = ms(
        lambda: kept.__setitem__("y", torch.nn.functional.linear(x, w, b).matmul(w)))
    parts["first sum (its kernel)"] = ms(lambda: kept.__setitem__("s", kept["y"].sum()))
    parts["first backward (autograd's device thread, its handles, its kernels)"] = ms(lambda: kept["s"].backward())
    parts["all of the above again"] = ms(lambda: torch.nn.functional.linear(x, w, b).matmul(w).sum().backward())
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    parts["nvmlInit_v2"] = ms(nvml.nvmlInit_v2)
    parts["cudaMemGetInfo"] = ms(torch.cuda.mem_get_info)
    try:
        cupti = ctypes.CDLL("libcupti.so.13", mode=ctypes.RTLD_GLOBAL)
        callback = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p)(
            lambda *_: None)
        subscriber = ctypes.c_void_p()
        parts["cuptiSubscribe"] = ms(lambda: cupti.cuptiSubscribe(ctypes.byref(subscriber), callback, None))
    except OSError as e:
        parts[f"cuptiSubscribe: {e}"] = 0.0
    print(" | ".join(f"{name}: {value:.2f}" for name, value in parts.items()))


main()
