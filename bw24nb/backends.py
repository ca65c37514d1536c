"""Choose and build the backend that runs a model: the GPU engine or the numpy reference."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import device


class ReferenceBackend:
    """The numpy reference model behind the generate.Backend protocol (CPU, slow, exact)."""

    name = "numpy reference (CPU)"

    def __init__(self, model, n_ctx: int):
        self.model = model
        self.n_ctx = n_ctx

    def reset(self):
        self.model.reset()

    def prefill(self, ids):
        return np.asarray(self.model.prefill(np.asarray(ids, dtype=np.int64)))[-1]

    def decode(self, token):
        return np.asarray(self.model.decode(int(token)))


@dataclass
class LoadedModel:
    source: object          # TensorSource
    tokenizer: object       # bw24nb.tokenizer.Tokenizer
    backend: object         # generate.Backend
    load_s: float


def load_tokenizer(source):
    from .tokenizer import Tokenizer
    if source.format == "gguf":
        return Tokenizer.from_gguf_metadata(source.metadata)
    return Tokenizer.from_hf_dir(source.path)


def load(path, n_ctx: int = 4096, which: str = "auto", log=print,
         engine_options: dict | None = None) -> LoadedModel:
    """Open `path` and build a backend. which: auto (GPU if present) | gpu | cpu.
    engine_options: extra Engine(...) keyword arguments (the CPU reference ignores them)."""
    import time

    from .formats import open_model

    t0 = time.perf_counter()
    source = open_model(path)
    tokenizer = load_tokenizer(source)
    n_ctx = min(n_ctx, source.config.max_position_embeddings or n_ctx)
    use_gpu = which == "gpu" or (which == "auto" and device.gpu_present())
    if use_gpu:
        from .engine import Engine
        backend = Engine(source, n_ctx=n_ctx, log=log, **(engine_options or {}))
    else:
        from .models import load_weights
        from .reference.model import ReferenceModel
        backend = ReferenceBackend(ReferenceModel(source.config, load_weights(source)), n_ctx)
    return LoadedModel(source, tokenizer, backend, time.perf_counter() - t0)
