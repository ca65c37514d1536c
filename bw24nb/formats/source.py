"""TensorSource: the uniform view of a checkpoint's tensors, whatever the file format.

Shapes are in numpy order (outermost first): a linear weight is (out_features, in_features),
i.e. GGUF's `ne` reversed. `raw(name)` is a zero-copy uint8 view of the stored bytes
(memory-mapped); `dequantize(name)` decodes to float32 through bw24nb.quant.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .config import ModelConfig


@dataclass(frozen=True)
class TensorInfo:
    name: str
    qtype: int                 # bw24nb.quant.QType value (GGUF's GGMLQuantizationType ids)
    shape: tuple[int, ...]     # numpy order
    nbytes: int


class TensorSource(Protocol):
    path: str
    format: str                # "gguf" or "safetensors"
    config: ModelConfig
    metadata: dict             # raw key -> python value (GGUF KV pairs, or config.json)

    def names(self) -> list[str]: ...
    def has(self, name: str) -> bool: ...
    def info(self, name: str) -> TensorInfo: ...
    def raw(self, name: str) -> np.ndarray: ...
    def dequantize(self, name: str) -> np.ndarray: ...
