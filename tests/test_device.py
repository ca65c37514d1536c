"""bw24nb/device.py: what the engine asks about the machine and its arrays."""
import numpy as np
import pytest
from numba import cuda

from bw24nb.device import features_for, is_device_array


def test_is_device_array_tells_device_from_host_data():
    """engine_spec keeps the verify's hidden rows on the device and copies host rows in: the
    test must hold under the simulator too (it has no cuda.is_cuda_array)."""
    host = np.zeros((2, 8), np.float32)
    assert is_device_array(cuda.to_device(host))
    assert is_device_array(cuda.device_array(4, np.int32))
    assert not is_device_array(host)
    assert not is_device_array([1.0, 2.0])


def test_arch_features_of_the_targets():
    assert features_for((9, 0)).name == "sm_90" and features_for((9, 0)).int8_mma
    assert not features_for((9, 0)).native_fp4_cvt


def test_sm_count_is_the_default_where_no_gpu_can_be_asked():
    """device.sm_count sizes grids to the GPU (matmul_q8's tile choice, matvec_q4k's
    persistent kernel); without a GPU (the simulator, CI) it is the H200's 132."""
    from bw24nb import device
    if device.gpu_present():
        pytest.skip("a GPU is present: sm_count asks it")
    assert device.sm_count() == device.SM_COUNT_DEFAULT == 132
