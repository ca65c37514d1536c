"""The one place that knows which GPU (or simulator) we run on.

Architecture-specific choices (which PTX path, tile sizes tuned per chip) are looked up here
and nowhere else, so adding a target means editing this file and the tune tables it names.

Importing this module does not import numba.cuda: the CLI uses it to decide between the
numpy reference and the GPU engine before paying for numba's import.
"""
from __future__ import annotations

import ctypes.util
import os
from dataclasses import dataclass
from functools import lru_cache


def simulator_enabled() -> bool:
    """True when numba's CUDA simulator stands in for a GPU (NUMBA_ENABLE_CUDASIM=1)."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"


@lru_cache(maxsize=1)
def gpu_present() -> bool:
    """A real CUDA device is usable (driver library present and numba sees a GPU)."""
    if simulator_enabled():
        return False
    if ctypes.util.find_library("cuda") is None and not os.path.exists("/usr/lib/x86_64-linux-gnu/libcuda.so.1"):
        return False
    try:
        from numba import cuda
        return bool(cuda.is_available())
    except Exception:  # a broken driver install is "no GPU" for our purposes
        return False


def is_device_array(a) -> bool:
    """True for data in device memory: a numba device array (the simulator's stand-ins too,
    which `cuda.is_cuda_array` -- absent under the simulator -- would not tell)."""
    from numba import cuda
    if simulator_enabled():
        return hasattr(a, "copy_to_host")
    return cuda.is_cuda_array(a)


@dataclass(frozen=True)
class ArchFeatures:
    """What the target architecture offers that kernels choose between."""
    cc: tuple[int, int]
    native_fp4_cvt: bool      # cvt.rn.f16x2.e2m1x2 (sm_100a / sm_120a and later)
    int8_mma: bool            # mma.sync.m16n8k32.s8 (sm_80 and later)
    grid_dependency: bool     # griddepcontrol + programmatic graph edges (sm_90 and later)
    bulk_prefetch: bool       # cp.async.bulk.prefetch.L2 (sm_90 and later)
    clusters: bool            # thread-block clusters, their barrier and DSMEM (sm_90 and later)

    @property
    def name(self) -> str:
        return f"sm_{self.cc[0]}{self.cc[1]}"


def features_for(cc: tuple[int, int]) -> ArchFeatures:
    return ArchFeatures(cc=cc, native_fp4_cvt=cc >= (10, 0), int8_mma=cc >= (8, 0),
                        grid_dependency=cc >= (9, 0), bulk_prefetch=cc >= (9, 0),
                        clusters=cc >= (9, 0))


SM_COUNT_DEFAULT = 132      # the H200's, where the device cannot be asked (the simulator)


@lru_cache(maxsize=1)
def sm_count() -> int:
    """Multiprocessors of the device in use, for grids sized to the GPU (matmul_q8's tile
    choice, matvec_q4k's persistent kernel); SM_COUNT_DEFAULT where no GPU can be asked."""
    if gpu_present():
        try:
            from numba import cuda
            return int(cuda.get_current_device().MULTIPROCESSOR_COUNT)
        except Exception:               # noqa: BLE001 -- a broken context: the default
            pass
    return SM_COUNT_DEFAULT


@lru_cache(maxsize=1)
def current_features() -> ArchFeatures:
    """Features of the device in use; the simulator poses as sm_90 (our verified target)."""
    if gpu_present():
        from numba import cuda
        return features_for(tuple(cuda.get_current_device().compute_capability))
    return features_for((9, 0))
