"""Compiling kernels with no GPU: PTX from numba, SASS from nvJitLink.

Used by the compile check (tests/test_compile_ptx.py), the matvec PTX test and
bench/sass_count.py. Must run without NUMBA_ENABLE_CUDASIM (the simulator has no
compile_ptx) and needs an NVVM (`pip install "numba-cuda[cu13]"`) and cuda-bindings' nvJitLink,
the same toolkit version as that NVVM, so its PTX always assembles.
"""
from __future__ import annotations


class _NoGpuDevice:
    """Stands in for ``get_current_device()`` where numba-cuda 0.30 asks for one while compiling
    a kernel's ``@cuda.jit(device=True)`` callees (``CUDADispatcher.compile_device`` reads the
    device's compute capability) — on a machine without a GPU that call fails at driver init.
    The PTX target still comes from compile_ptx's ``cc``."""
    compute_capability = (9, 0)


def allow_compiling_without_gpu() -> None:
    """Let numba compile device functions when no GPU is present (no-op when one is)."""
    from numba import cuda
    from numba.cuda import dispatcher

    if not cuda.is_available():
        dispatcher.get_current_device = lambda: _NoGpuDevice


def compile_ptx(dispatcher, sig, cc) -> str:
    """PTX of a @cuda.jit / @kernel dispatcher for signature `sig` at compute capability `cc`,
    with the dispatcher's own fastmath / lineinfo / launch_bounds options."""
    from numba import cuda

    _NoGpuDevice.compute_capability = tuple(cc[:2])
    opts = getattr(dispatcher, "targetoptions", {}) or {}
    kwargs = {"cc": cc}
    for key in ("fastmath", "lineinfo", "launch_bounds"):
        if opts.get(key):
            kwargs[key] = opts[key]
    ptx, _ = cuda.compile_ptx(dispatcher.py_func, sig, **kwargs)
    return ptx


def link_ptx(ptx_texts: list[str], arch: str) -> tuple[bytes | None, str | None]:
    """(cubin, None) when nvJitLink links these PTX modules for ``arch`` (e.g. "sm_90"), else
    (None, its error log)."""
    from cuda.bindings import nvjitlink

    handle = nvjitlink.create(1, [f"-arch={arch}"])
    try:
        for i, text in enumerate(ptx_texts):
            data = text.encode()
            nvjitlink.add_data(handle, nvjitlink.InputType.PTX, data, len(data), f"module{i}")
        nvjitlink.complete(handle)
        cubin = bytearray(nvjitlink.get_linked_cubin_size(handle))
        nvjitlink.get_linked_cubin(handle, cubin)
        return bytes(cubin), None
    except nvjitlink.nvJitLinkError as exc:
        size = nvjitlink.get_error_log_size(handle)
        log = bytearray(size)
        if size:
            nvjitlink.get_error_log(handle, log)
        return None, f"{exc}: {bytes(log).decode(errors='replace').strip(chr(0)).strip()}"
    finally:
        nvjitlink.destroy(handle)
