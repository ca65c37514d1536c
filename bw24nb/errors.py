"""Typed errors. Every message names the file/field at fault and says what to do.

Callers (the CLI, the server) catch `Bw24Error` and print its message; anything else
escaping is a bug in bw24nb.
"""


class Bw24Error(Exception):
    """Base of every error bw24nb raises on purpose."""


class ModelFormatError(Bw24Error):
    """A model file or directory is malformed (bad magic, truncated, shape mismatch, ...)."""

    def __init__(self, path, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class UnsupportedArchitecture(Bw24Error):
    """The checkpoint is well-formed but its architecture is not one bw24nb runs."""


class UnsupportedTensorType(Bw24Error):
    """A tensor is stored in a quantization type bw24nb has no codec/kernel for."""


class MissingTensor(ModelFormatError):
    """A tensor the model family needs is absent from the checkpoint."""


class ContextOverflow(Bw24Error):
    """A prompt (plus requested tokens) does not fit the context window."""


class OutOfDeviceMemory(Bw24Error):
    """Weights + caches do not fit the VRAM budget; the message gives both sizes."""


class DownloadError(Bw24Error):
    """Fetching or verifying the default model failed (offline, hash mismatch, ...)."""
