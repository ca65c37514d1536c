"""numpy reference implementations: the oracle for every kernel and for whole models.

- `ops.py`            rms_norm, rope, swiglu, softmax, linear, GQA attention
- `moe.py`            router + experts + shared expert
- `attention.py`      full-attention mixer with KV cache (qk-norm, partial RoPE, output gate)
- `gated_deltanet.py` Gated DeltaNet linear-attention mixer (Qwen3-Next / Qwen3.5)
- `model.py`          `ReferenceModel`: prefill / decode / mtp_draft for every family

`load_reference(path)` opens a checkpoint (GGUF file or HF directory) and builds the model.
"""
from __future__ import annotations


def load_reference(path):
    """Open `path` (GGUF file or HF safetensors directory) -> `(ReferenceModel, source)`.

    Weights are dequantized to float32 and renamed to the internal (llama.cpp) names.
    """
    from ..formats import open_model
    from ..models import load_weights
    from .model import ReferenceModel

    source = open_model(path)
    weights = load_weights(source)
    return ReferenceModel(source.config, weights), source


__all__ = ["load_reference"]
