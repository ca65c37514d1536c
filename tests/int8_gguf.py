"""Test helper: a checked-in F16 fixture re-encoded with integer block types, so that the
engine's int8 paths (dp4a matvecs, the int8 GEMM, the int8 MoE block) run on it."""
import numpy as np

from bw24nb.formats import open_model
from bw24nb.formats.gguf_writer import QuantizedTensor, write_gguf
from bw24nb.quant import quantize


def requantized_gguf(fixture, path, types, experts=False):
    """Write `fixture` to `path` with every matrix whose rows are whole 32-blocks in one of
    `types` (by turns); with `experts`, the 3-D expert stacks too (routers stay float)."""
    src = open_model(fixture)
    tensors = {}
    for j, name in enumerate(src.names()):
        x = np.ascontiguousarray(src.dequantize(name), np.float32)
        ndims = (2, 3) if experts else (2,)
        if x.ndim in ndims and x.shape[-1] % 32 == 0 and "gate_inp" not in name:
            qt = types[j % len(types)]
            tensors[name] = QuantizedTensor(quantize(x.reshape(-1, x.shape[-1]), qt), int(qt),
                                            x.shape)
        else:
            tensors[name] = x
    return write_gguf(path, src.config, tensors)
