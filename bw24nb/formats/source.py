"""TensorSource: the uniform view of a checkpoint's tensors, whatever the file format.

Shapes are in numpy order (outermost first): a linear weight is (out_features, in_features),
i.e. GGUF's `ne` reversed. `raw(name)` is a zero-copy, read-only uint8 view of the stored
bytes (memory-mapped) shaped `(*shape[:-1], row_bytes)` -- the layout `bw24nb.quant.quantize`
returns -- or `(nbytes,)` for a 0-d tensor. `dequantize(name)` decodes to a fresh float32 array
of `shape` through `bw24nb.quant`.

`qtype` is a `bw24nb.quant.QType` id: GGUF's `GGMLQuantizationType` ids (< 1000), ids from
1000 that `bw24nb.quant` owns for codecs GGUF lacks (FP8_E4M3 = 1000), and the storage-only
ids below (1100+) for safetensors dtypes that are plain integers or unnamed by GGUF; those are
carried byte-exactly for the model layer (e.g. modelopt NVFP4 packs its E2M1 pairs as U8).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..errors import UnsupportedTensorType
from .config import ModelConfig

# GGUF ids for plain storage types (GGMLQuantizationType values).
QTYPE_F32 = 0
QTYPE_F16 = 1
QTYPE_I8 = 24
QTYPE_I16 = 25
QTYPE_I32 = 26
QTYPE_I64 = 27
QTYPE_F64 = 28
QTYPE_BF16 = 30

# Storage-only ids: safetensors dtypes that neither GGUF nor bw24nb.quant names. Values are
# decoded (dequantize) only where the meaning is unambiguous (unsigned ints, bool).
QTYPE_U8 = 1100          # safetensors "U8" (e.g. modelopt NVFP4 packed E2M1 pairs)
QTYPE_U16 = 1101
QTYPE_U32 = 1102
QTYPE_U64 = 1103
QTYPE_BOOL = 1104
QTYPE_FP8_E5M2 = 1105    # safetensors "F8_E5M2" (carried raw; no codec)
QTYPE_FP8_E8M0 = 1106    # safetensors "F8_E8M0" (MX block scales; carried raw; no codec)

STORAGE_QTYPE_NAMES = {
    QTYPE_U8: "U8", QTYPE_U16: "U16", QTYPE_U32: "U32", QTYPE_U64: "U64", QTYPE_BOOL: "BOOL",
    QTYPE_FP8_E5M2: "F8_E5M2", QTYPE_FP8_E8M0: "F8_E8M0",
}

# Types whose values are plain numbers: dequantize is a cast, never a codec.
_PLAIN_NUMPY = {
    QTYPE_I8: np.int8, QTYPE_I16: np.int16, QTYPE_I32: np.int32, QTYPE_I64: np.int64,
    QTYPE_F64: np.float64, QTYPE_U8: np.uint8, QTYPE_U16: np.uint16, QTYPE_U32: np.uint32,
    QTYPE_U64: np.uint64, QTYPE_BOOL: np.bool_,
}


def _resolve_fp8_id(default: int = 1000) -> int:
    try:
        from ..quant import QType  # noqa: PLC0415  (optional sibling module)
    except ImportError:
        return default
    return int(getattr(QType, "FP8_E4M3", default))


# bw24nb.quant's id for FP8 E4M3 (one byte per value, OCP e4m3fn): read from
# bw24nb.quant.QType when that module is importable, else its documented id 1000.
QTYPE_FP8_E4M3 = _resolve_fp8_id()


@dataclass(frozen=True)
class TensorInfo:
    name: str
    qtype: int                 # bw24nb.quant.QType value (GGUF's GGMLQuantizationType ids)
    shape: tuple[int, ...]     # numpy order
    nbytes: int
    file: str = ""             # the file holding the bytes
    offset: int = 0            # absolute byte offset of the data in `file`


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


def raw_view_shape(shape: tuple[int, ...], nbytes: int) -> tuple[int, ...]:
    """Shape of the uint8 view of a tensor's bytes: rows of the last axis."""
    if not shape:
        return (nbytes,)
    rows = 1
    for d in shape[:-1]:
        rows *= d
    return (*shape[:-1], nbytes // rows if rows else 0)


def dequantize_raw(raw: np.ndarray, qtype: int, shape: tuple[int, ...], what: str) -> np.ndarray:
    """Stored bytes -> fresh float32[shape]. `what` names the tensor in errors.

    Plain integer/bool/f64 types are cast here; every float or block format goes to
    `bw24nb.quant.dequantize`. Only when that module is not importable (early in the project)
    do GGUF types fall back to `gguf.quants.dequantize`.
    """
    flat = np.ascontiguousarray(raw).reshape(-1)
    shape = tuple(int(d) for d in shape)
    if qtype == QTYPE_BOOL:
        return (flat != 0).reshape(shape).astype(np.float32)
    if qtype in _PLAIN_NUMPY:
        return flat.view(_PLAIN_NUMPY[qtype]).reshape(shape).astype(np.float32)
    if qtype in STORAGE_QTYPE_NAMES:
        raise UnsupportedTensorType(
            f"{what}: stored as {STORAGE_QTYPE_NAMES[qtype]}, which bw24nb carries raw but "
            f"cannot decode to float; the model layer must repack it (see raw())")
    try:
        from ..quant import dequantize as quant_dequantize  # noqa: PLC0415
    except ModuleNotFoundError as e:
        if e.name != "bw24nb.quant":     # the module exists but is broken: say so
            raise
        quant_dequantize = None
    if quant_dequantize is not None:
        try:
            # bw24nb.quant wants at least one axis; a 0-d tensor is one value.
            out = quant_dequantize(flat, qtype, shape or (1,))
        except (NotImplementedError, KeyError) as e:
            raise UnsupportedTensorType(f"{what}: bw24nb.quant cannot decode type id {qtype}: {e}") from None
        out = np.asarray(out, dtype=np.float32).reshape(shape)
        # Callers own the result: never hand out a view of the read-only mapping.
        return out.copy() if np.may_share_memory(out, flat) or not out.flags.writeable else out
    return _dequantize_with_gguf(flat, qtype, shape or (1,), what).reshape(shape)


def _dequantize_with_gguf(flat: np.ndarray, qtype: int, shape: tuple[int, ...], what: str) -> np.ndarray:
    """Fallback decoder (gguf-py) used only while bw24nb.quant is absent."""
    import gguf  # noqa: PLC0415
    if qtype == QTYPE_FP8_E4M3:
        raise UnsupportedTensorType(f"{what}: FP8 E4M3 needs bw24nb.quant, which is not importable")
    try:
        gt = gguf.GGMLQuantizationType(qtype)
    except ValueError:
        raise UnsupportedTensorType(f"{what}: unknown tensor type id {qtype}") from None
    if gt == gguf.GGMLQuantizationType.BF16:
        return (flat.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape).copy()
    block, tsize = gguf.GGML_QUANT_SIZES[gt]
    rows = flat.reshape(-1, (shape[-1] // block) * tsize) if shape else flat
    try:
        out = gguf.quants.dequantize(rows, gt)
    except NotImplementedError:
        raise UnsupportedTensorType(f"{what}: no decoder for {gt.name}") from None
    return np.array(out, dtype=np.float32, copy=True).reshape(shape)


class MappedTensorSource:
    """A TensorSource over memory-mapped files: a table name -> (TensorInfo, uint8 buffer).

    Subclasses (the GGUF and safetensors readers) validate their headers and fill `_table`;
    everything after that is format-independent and never copies tensor bytes.
    """

    path: str
    format: str
    config: ModelConfig
    metadata: dict

    def __init__(self, path: str, fmt: str):
        self.path = str(path)
        self.format = fmt
        self.metadata = {}
        self._table: dict[str, tuple[TensorInfo, np.ndarray]] = {}

    # -- the TensorSource protocol ------------------------------------------------------
    def names(self) -> list[str]:
        return list(self._table)

    def has(self, name: str) -> bool:
        return name in self._table

    def info(self, name: str) -> TensorInfo:
        return self._entry(name)[0]

    def raw(self, name: str) -> np.ndarray:
        info, buf = self._entry(name)
        view = buf[info.offset:info.offset + info.nbytes]
        return view.reshape(raw_view_shape(info.shape, info.nbytes))

    def dequantize(self, name: str) -> np.ndarray:
        info = self.info(name)
        return dequantize_raw(self.raw(name), info.qtype, info.shape,
                              f"{info.file or self.path}: tensor {name!r}")

    # -- helpers --------------------------------------------------------------------------
    def _entry(self, name: str) -> tuple[TensorInfo, np.ndarray]:
        try:
            return self._table[name]
        except KeyError:
            from ..errors import MissingTensor  # noqa: PLC0415
            raise MissingTensor(self.path, f"no tensor named {name!r} in this checkpoint") from None

    def close(self) -> None:
        """Drop this source's references to the mapped files (views already handed out stay
        valid: they keep their own reference to the mapping)."""
        self._table = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.format} {self.path!r}: {len(self._table)} tensors>"
