"""Model formats: GGUF files and HF safetensors directories -> ModelConfig + TensorSource.

`open_model(path)` is the one entry point; it dispatches on whether `path` is a GGUF file
or a directory holding config.json + *.safetensors.
"""
from .config import FULL_ATTENTION, LINEAR_ATTENTION, ModelConfig
from .open import open_model
from .source import TensorInfo, TensorSource

__all__ = ["FULL_ATTENTION", "LINEAR_ATTENTION", "ModelConfig", "TensorInfo", "TensorSource",
           "open_model"]
