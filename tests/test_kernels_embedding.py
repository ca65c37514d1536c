"""Embedding lookup from quantized tables, every weight type: the kernel decodes each value
exactly as the numpy codec does, so the comparison is bit for bit (float32 bit patterns)."""
import numpy as np
import pytest
from numba import cuda

from bw24nb.kernels import launch_embedding
from bw24nb.kernels.dequant import LAYOUTS, random_weight_bytes
from bw24nb.kernels.embedding import embedding_reference
from bw24nb.quant import QType


def _lookup(table, qt, V, H, ids):
    out = cuda.to_device(np.full((len(ids), H), np.nan, np.float32))
    launch_embedding(cuda.to_device(table), qt, V, H, cuda.to_device(np.asarray(ids, np.int32)), out)
    return out.copy_to_host()


@pytest.mark.parametrize("qt", list(LAYOUTS), ids=lambda q: q.name)
def test_embedding_bit_exact(rng, qt):
    # H = 256 is one K-quant super-block, four NVFP4 blocks, eight Q8_0 blocks per row, and two
    # 128-thread blocks of the grid; ids repeat and include the first and last row.
    V, H, T = 7, 256, 5
    table = random_weight_bytes(rng, qt, V, H)
    ids = np.concatenate([[0, V - 1], rng.integers(0, V, T - 2)]).astype(np.int32)
    ids[-1] = ids[-2]
    out = _lookup(table, qt, V, H, ids)
    ref = embedding_reference(table, qt, V, H, ids)
    np.testing.assert_array_equal(out.view(np.uint32), ref.view(np.uint32))


def test_embedding_bad_id_gives_nan_row(rng):
    qt, V, H = QType.Q8_0, 4, 64
    table = random_weight_bytes(rng, qt, V, H)
    out = _lookup(table, qt, V, H, [2, -1, V, 0])
    ref = embedding_reference(table, qt, V, H, [2, 0])
    assert np.isnan(out[1]).all() and np.isnan(out[2]).all()
    np.testing.assert_array_equal(out[[0, 3]], ref)


def test_embedding_dense_odd_width(rng):
    # dense tables have no block constraint: H = 130 leaves a partial 128-thread block
    qt, V, H = QType.BF16, 3, 130
    table = random_weight_bytes(rng, qt, V, H)
    out = _lookup(table, qt, V, H, [1, 2])
    np.testing.assert_array_equal(out.view(np.uint32),
                                  embedding_reference(table, qt, V, H, [1, 2]).view(np.uint32))
