"""open_model(path): the one entry point from a path on disk to a TensorSource.

A file is read as GGUF, a directory as an HF checkpoint (config.json + *.safetensors).
Every problem with the input surfaces as a bw24nb.errors.Bw24Error subclass naming the file.
"""
from __future__ import annotations

import os

from ..errors import ModelFormatError
from .source import MappedTensorSource


def open_model(path) -> MappedTensorSource:
    """Open a GGUF file or an HF safetensors directory -> TensorSource with `.config`."""
    path = os.fspath(path)
    if os.path.isdir(path):
        from .safetensors_reader import read_safetensors_dir  # noqa: PLC0415
        return read_safetensors_dir(path)
    if os.path.isfile(path):
        if path.endswith(".safetensors"):
            raise ModelFormatError(path, "a single .safetensors file has no config.json; open the "
                                         "directory that holds it (config.json + *.safetensors)")
        from .gguf_reader import read_gguf  # noqa: PLC0415
        return read_gguf(path)
    if os.path.lexists(path):
        raise ModelFormatError(path, "neither a file nor a directory (a broken link?)")
    raise ModelFormatError(path, "no such file or directory; pass a .gguf file or an HF "
                                 "checkpoint directory (config.json + *.safetensors)")
