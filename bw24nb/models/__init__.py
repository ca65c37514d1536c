"""Model families: internal tensor naming, HF -> internal conversion, what each family needs.

Internal names are llama.cpp's GGUF names (see `weights.py`). `FAMILY_MODULES` maps
`ModelConfig.family` to the module that describes it; modules are imported on first use so a
family whose module is absent only fails when it is asked for.

A family module provides:
    HF_NAME_RULES               [(regex, internal template)] for HF safetensors names
    HF_IGNORE                   optional regexes of HF names to skip
    convert_hf(w, config, src)  optional: llama.cpp converter transforms beyond renaming
    convert_gguf(w, config, src) optional: fix-ups for GGUF files
    tensor_names(config)        every internal tensor the family needs
"""
from __future__ import annotations

import importlib

from ..errors import UnsupportedArchitecture
from .weights import Weights, load_weights

FAMILY_MODULES: dict[str, str] = {
    "qwen2": "bw24nb.models.qwen2",
    "qwen3": "bw24nb.models.qwen3",
    "qwen3moe": "bw24nb.models.qwen3moe",
    # Hybrid Gated-DeltaNet families live together in one module.
    "qwen3next": "bw24nb.models.qwen35",
    "qwen35": "bw24nb.models.qwen35",
    "qwen35moe": "bw24nb.models.qwen35",
}


def family_module(family: str):
    """The module describing `family` (imported lazily)."""
    try:
        modname = FAMILY_MODULES[family]
    except KeyError:
        raise UnsupportedArchitecture(
            f"model family {family!r} is not supported; bw24nb runs {sorted(FAMILY_MODULES)}") from None
    try:
        return importlib.import_module(modname)
    except ModuleNotFoundError as e:
        if e.name != modname:
            raise
        raise UnsupportedArchitecture(
            f"model family {family!r} is registered but its module {modname} is not available "
            f"in this build") from None


__all__ = ["FAMILY_MODULES", "Weights", "family_module", "load_weights"]
