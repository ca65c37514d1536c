"""GGUF file -> TensorSource + ModelConfig, memory-mapped, tensor bytes never copied.

GGUF layout (little-endian, version 2/3):

    "GGUF" | u32 version | u64 n_tensors | u64 n_kv
    n_kv x      (string key, u32 value type, value)          -- metadata
    n_tensors x (string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset)
    padding to `general.alignment` (default 32)
    tensor data: tensor i at data_start + offset_i, each padded to the alignment

The header is parsed here with a bounds-checked cursor rather than `gguf.GGUFReader`, for two
measured reasons: GGUFReader trusts the counts in the file (a corrupted array length makes it
loop ~2**64 times over empty slices -- a hang, found by tests/test_formats_fuzz.py) and it
builds two numpy views per string, so a Qwen vocabulary (152k tokens + 151k merges) takes
4-15 s to open against ~0.3 s here. The `gguf` package still supplies every constant (type ids,
block sizes, key names), and tests/test_formats.py checks this parser against GGUFReader on
files written by GGUFWriter.

Every inconsistency raises ModelFormatError naming the file and what is wrong: bad magic,
unsupported version, truncation, tensor data past EOF, tensor offsets that disagree with the
shapes and types before them (what llama.cpp's gguf loader checks too).
"""
from __future__ import annotations

import math
import mmap
import os
import struct

import gguf
import numpy as np

from ..errors import ModelFormatError, UnsupportedArchitecture, UnsupportedTensorType
from .config import (FULL_ATTENTION, GGUF_ARCH_TO_FAMILY, HYBRID_FAMILIES, MAX_LAYERS,
                     MOE_FAMILIES, ModelConfig, layer_types_from_interval, validate_config)
from .source import MappedTensorSource, TensorInfo

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
GGML_MAX_DIMS = 4
DEFAULT_ALIGNMENT = gguf.GGUF_DEFAULT_ALIGNMENT

VT = gguf.GGUFValueType
# value type -> (struct format, numpy dtype), both little-endian; sizes follow from either.
_SCALAR_TYPES = {
    VT.UINT8: ("<B", "<u1"), VT.INT8: ("<b", "<i1"), VT.UINT16: ("<H", "<u2"),
    VT.INT16: ("<h", "<i2"), VT.UINT32: ("<I", "<u4"), VT.INT32: ("<i", "<i4"),
    VT.FLOAT32: ("<f", "<f4"), VT.BOOL: ("<B", "<u1"), VT.UINT64: ("<Q", "<u8"),
    VT.INT64: ("<q", "<i8"), VT.FLOAT64: ("<d", "<f8"),
}
_SCALAR_STRUCT = {vt: struct.Struct(fmt) for vt, (fmt, _) in _SCALAR_TYPES.items()}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

_TRUNCATED_HINT = "the file is truncated or corrupted (an interrupted download?); fetch it again"


class _Cursor:
    """Reads the header with every length checked against the file size before use, so a
    corrupted count fails fast instead of looping or allocating."""

    def __init__(self, buf, size: int, path: str):
        self.buf = buf
        self.size = size
        self.path = path
        self.pos = 0

    def fail(self, problem: str):
        raise ModelFormatError(self.path, problem)

    def take(self, n: int, what: str) -> int:
        start = self.pos
        if n < 0 or start + n > self.size:
            self.fail(f"header ends inside {what} (needs {n} bytes at offset {start}, file has "
                      f"{self.size}): {_TRUNCATED_HINT}")
        self.pos = start + n
        return start

    def u32(self, what: str) -> int:
        return _U32.unpack_from(self.buf, self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return _U64.unpack_from(self.buf, self.take(8, what))[0]

    def string(self, what: str) -> str:
        n = self.u64(f"the length of {what}")
        start = self.take(n, what)
        try:
            return bytes(self.buf[start:start + n]).decode("utf-8")
        except UnicodeDecodeError:
            self.fail(f"{what} at offset {start} is not valid UTF-8: the header is corrupted")

    def remaining(self) -> int:
        return self.size - self.pos


def _read_value(cur: _Cursor, vtype: int, key: str):
    """One metadata value of type `vtype` as a python value (arrays as lists)."""
    what = f"the value of metadata key {key!r}"
    if vtype == VT.STRING:
        return cur.string(what)
    if vtype in _SCALAR_TYPES:
        st = _SCALAR_STRUCT[vtype]
        v = st.unpack_from(cur.buf, cur.take(st.size, what))[0]
        return bool(v) if vtype == VT.BOOL else v
    if vtype == VT.ARRAY:
        itype = cur.u32(f"the element type of {what}")
        count = cur.u64(f"the length of {what}")
        if itype == VT.STRING:
            if count * 8 > cur.remaining():
                cur.fail(f"metadata key {key!r} claims {count} strings but only "
                         f"{cur.remaining()} bytes follow: {_TRUNCATED_HINT}")
            return _read_string_array(cur, count, what)
        if itype in _SCALAR_TYPES:
            dtype = _SCALAR_TYPES[itype][1]
            start = cur.take(count * np.dtype(dtype).itemsize, what)
            arr = np.frombuffer(cur.buf, dtype=dtype, count=count, offset=start)
            return (arr != 0).tolist() if itype == VT.BOOL else arr.tolist()
        if itype == VT.ARRAY:
            cur.fail(f"metadata key {key!r} is an array of arrays, which GGUF readers "
                     f"(llama.cpp included) do not support: the header is corrupted")
        cur.fail(f"metadata key {key!r} is an array of unknown value type {itype}: the header "
                 f"is corrupted or from a newer GGUF version")
    cur.fail(f"metadata key {key!r} has unknown value type {vtype}: the header is corrupted or "
             f"from a newer GGUF version")


def _read_string_array(cur: _Cursor, count: int, what: str) -> list[str]:
    # The hot loop of opening a real model (vocabularies are ~150k strings): locals only.
    buf, size, pos = cur.buf, cur.size, cur.pos
    unpack = _U64.unpack_from
    out = []
    append = out.append
    for i in range(count):
        if pos + 8 > size:
            cur.pos = pos
            cur.fail(f"header ends inside element {i} of {what}: {_TRUNCATED_HINT}")
        n = unpack(buf, pos)[0]
        pos += 8
        if pos + n > size:
            cur.pos = pos
            cur.fail(f"element {i} of {what} runs past the end of the file: {_TRUNCATED_HINT}")
        try:
            append(buf[pos:pos + n].decode("utf-8"))
        except UnicodeDecodeError:
            cur.fail(f"element {i} of {what} is not valid UTF-8: the header is corrupted")
        pos += n
    cur.pos = pos
    return out


def _map_file(path: str):
    """(mmap, size) of a non-empty regular file, or ModelFormatError."""
    if not os.path.exists(path):
        raise ModelFormatError(path, "no such file")
    if not os.path.isfile(path):
        raise ModelFormatError(path, "not a regular file")
    size = os.path.getsize(path)
    if size == 0:
        raise ModelFormatError(path, "the file is empty (0 bytes), not a model")
    try:
        with open(path, "rb") as f:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise ModelFormatError(path, f"cannot memory-map the file: {e}") from None
    return mm, size


class GGUFSource(MappedTensorSource):
    """A GGUF file as a TensorSource (`format == "gguf"`). Extra attributes: `version`,
    `alignment`, `data_offset` (absolute offset of the tensor data section)."""

    def __init__(self, path):
        path = os.fspath(path)
        super().__init__(path, "gguf")
        mm, size = _map_file(path)
        self._mm = mm
        self.file_size = size
        self._parse(mm, size)
        self.config = config_from_gguf(self.metadata, {n: i.shape for n, (i, _) in self._table.items()},
                                       path)

    def _parse(self, mm, size: int) -> None:
        path = self.path
        cur = _Cursor(mm, size, path)
        magic = bytes(mm[:4])
        if magic != GGUF_MAGIC:
            raise ModelFormatError(path, f"not a GGUF file: it starts with {magic!r}, a GGUF file "
                                         f"starts with {GGUF_MAGIC!r}")
        cur.take(4, "the magic")
        version = cur.u32("the GGUF version")
        if version not in SUPPORTED_VERSIONS:
            if version & 0xFFFF == 0 and version:
                raise ModelFormatError(path, "big-endian GGUF files are not supported (their tensor "
                                             "data is byte-swapped); use a little-endian file")
            raise ModelFormatError(path, f"GGUF version {version} is not supported (supported: "
                                         f"{', '.join(map(str, SUPPORTED_VERSIONS))})")
        self.version = version
        n_tensors = cur.u64("the tensor count")
        n_kv = cur.u64("the metadata count")
        # Each KV needs >= 13 bytes (key length, type, 1-byte value); each tensor info >= 32.
        if n_kv * 13 > cur.remaining() or n_tensors * 32 > cur.remaining():
            cur.fail(f"the header claims {n_kv} metadata entries and {n_tensors} tensors, more than "
                     f"the {cur.remaining()} bytes that follow could hold: {_TRUNCATED_HINT}")

        meta: dict = {}
        for i in range(n_kv):
            key = cur.string(f"metadata key #{i}")
            vtype = cur.u32(f"the type of metadata key {key!r}")
            value = _read_value(cur, vtype, key)
            if key in meta:
                cur.fail(f"metadata key {key!r} appears twice: the header is corrupted")
            meta[key] = value
        self.metadata = meta

        infos = []
        seen = set()
        for i in range(n_tensors):
            name = cur.string(f"the name of tensor #{i}")
            if name in seen:
                cur.fail(f"tensor {name!r} appears twice: the header is corrupted")
            seen.add(name)
            n_dims = cur.u32(f"the dimension count of tensor {name!r}")
            if not 1 <= n_dims <= GGML_MAX_DIMS:
                cur.fail(f"tensor {name!r} has {n_dims} dimensions (GGUF allows 1..{GGML_MAX_DIMS}): "
                         f"the header is corrupted")
            ne = [cur.u64(f"dimension {d} of tensor {name!r}") for d in range(n_dims)]
            type_id = cur.u32(f"the type of tensor {name!r}")
            offset = cur.u64(f"the data offset of tensor {name!r}")
            infos.append((name, ne, type_id, offset))

        alignment = meta.get("general.alignment", DEFAULT_ALIGNMENT)
        if (not isinstance(alignment, int) or isinstance(alignment, bool) or alignment <= 0
                or alignment & (alignment - 1)):
            cur.fail(f"general.alignment = {alignment!r} is not a positive power of two")
        self.alignment = alignment
        data_start = _align(cur.pos, alignment)
        self.data_offset = data_start

        data = np.frombuffer(mm, dtype=np.uint8)
        expected = 0
        for name, ne, type_id, offset in infos:
            qtype, block, type_size = _tensor_type(path, name, type_id)
            n_elems = 1
            for d in ne:
                n_elems *= d
            if n_elems >= 1 << 62:
                cur.fail(f"tensor {name!r} has implausible dimensions {ne}: the header is corrupted")
            if ne[0] % block:
                cur.fail(f"tensor {name!r}: row length {ne[0]} is not a multiple of the "
                         f"{gguf.GGMLQuantizationType(qtype).name} block size {block}")
            nbytes = n_elems // block * type_size
            if offset != expected:
                cur.fail(f"tensor {name!r} has data offset {offset}, expected {expected} from the "
                         f"sizes of the tensors before it: the tensor table is inconsistent with "
                         f"the tensors' shapes and types (corrupted header)")
            expected = offset + _align(nbytes, alignment)
            shape = tuple(int(d) for d in reversed(ne))
            self._table[name] = (TensorInfo(name=name, qtype=qtype, shape=shape, nbytes=nbytes,
                                            file=path, offset=data_start + offset), data)
        # Only once the table is self-consistent does running past EOF mean truncation.
        for info, _ in self._table.values():
            if info.offset + info.nbytes > size:
                cur.fail(f"tensor {info.name!r} ({info.nbytes} bytes at offset {info.offset}) runs "
                         f"past the end of the file ({size} bytes): {_TRUNCATED_HINT}")

    def close(self) -> None:
        super().close()
        self._mm = None


def _align(x: int, alignment: int) -> int:
    return (x + alignment - 1) // alignment * alignment


def _tensor_type(path: str, name: str, type_id: int) -> tuple[int, int, int]:
    """(qtype, block size, bytes per block) for a GGUF type id."""
    try:
        gt = gguf.GGMLQuantizationType(type_id)
        block, type_size = gguf.GGML_QUANT_SIZES[gt]
    except (ValueError, KeyError):
        raise UnsupportedTensorType(
            f"{path}: tensor {name!r} has GGML type id {type_id}, which the gguf package does not "
            f"know (a corrupted header, or a type newer than the installed gguf package); "
            f"re-export the model with a common quantization (e.g. Q4_K_M)") from None
    return int(gt), block, type_size


def read_gguf(path) -> GGUFSource:
    """Open a GGUF file -> GGUFSource (TensorSource with `.config`)."""
    return GGUFSource(path)


# ---------------------------------------------------------------------------- ModelConfig
_REQUIRED = object()


def _f32_clean(x: float) -> float:
    """A float32 metadata value as the decimal it was written from (1e-06, not
    9.999999974752427e-07): numpy prints the shortest string that round-trips float32.
    Values that are not float32 numbers (from f64 fields) pass through unchanged."""
    if not math.isfinite(x) or abs(x) > 3.0e38:
        return x
    f = np.float32(x)
    return float(str(f)) if float(f) == x else x


class _Meta:
    """Typed lookups of `<arch>.*` keys with errors naming the key."""

    def __init__(self, meta: dict, arch: str, path: str):
        self.meta, self.arch, self.path = meta, arch, path

    def key(self, suffix: str) -> str:
        return f"{self.arch}.{suffix}"

    def missing(self, key: str):
        raise ModelFormatError(self.path, f"metadata key {key!r} is missing; the file is not a "
                                          f"complete {self.arch} model (or a corrupted one)")

    def int(self, suffix: str, default=_REQUIRED, *, full_key: bool = False, uniform: bool = False):
        key = suffix if full_key else self.key(suffix)
        if key not in self.meta:
            return self.missing(key) if default is _REQUIRED else default
        v = self.meta[key]
        if uniform and isinstance(v, list):
            # llama.cpp allows per-layer arrays; bw24nb's families use one value for all
            # layers (zeros mark layers without the part, e.g. no attention in a DeltaNet layer).
            vals = {x for x in v if x}
            if len(vals) != 1 or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
                raise UnsupportedArchitecture(
                    f"{self.path}: metadata key {key!r} varies per layer ({v[:8]}...); bw24nb "
                    f"supports one value for every layer")
            v = vals.pop()
        if not isinstance(v, int) or isinstance(v, bool):
            raise ModelFormatError(self.path, f"metadata key {key!r} = {v!r} should be an integer")
        return v

    def float(self, suffix: str, default=_REQUIRED):
        key = self.key(suffix)
        if key not in self.meta:
            return self.missing(key) if default is _REQUIRED else default
        v = self.meta[key]
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise ModelFormatError(self.path, f"metadata key {key!r} = {v!r} should be a number")
        return _f32_clean(float(v))


def config_from_gguf(meta: dict, shapes: dict[str, tuple[int, ...]], path: str) -> ModelConfig:
    """ModelConfig from GGUF metadata (llama.cpp key names) and the tensor table."""
    arch = meta.get("general.architecture")
    if arch is None:
        raise ModelFormatError(path, "metadata key 'general.architecture' is missing; not a model "
                                     "GGUF (or a corrupted one)")
    if not isinstance(arch, str):
        raise ModelFormatError(path, f"general.architecture = {arch!r} should be a string")
    family = GGUF_ARCH_TO_FAMILY.get(arch)
    if family is None:
        raise UnsupportedArchitecture(
            f"{path}: GGUF architecture {arch!r} is not supported; bw24nb runs "
            f"{', '.join(sorted(GGUF_ARCH_TO_FAMILY))}")
    m = _Meta(meta, arch, path)

    block_count = m.int("block_count")
    # llama.cpp counts the MTP (NextN) blocks in block_count and appends them after the main
    # stack: blk.{n_layer + i}.nextn.* (llama-model.cpp subtracts nextn_predict_layers).
    mtp = m.int("nextn_predict_layers", 0)
    n_layers = block_count - mtp
    if not (0 < n_layers <= MAX_LAYERS) or mtp < 0:
        raise ModelFormatError(path, f"{arch}.block_count = {block_count} with "
                                     f"{arch}.nextn_predict_layers = {mtp} leaves {n_layers} layers")
    hidden = m.int("embedding_length")
    heads = m.int("attention.head_count", uniform=True)
    kv_heads = m.int("attention.head_count_kv", heads, uniform=True)
    if heads <= 0:
        raise ModelFormatError(path, f"{arch}.attention.head_count = {heads} must be positive")
    head_dim = m.int("attention.key_length", hidden // heads)
    value_dim = m.int("attention.value_length", head_dim)
    if value_dim != head_dim:
        raise UnsupportedArchitecture(f"{path}: attention key_length {head_dim} != value_length "
                                      f"{value_dim}; bw24nb's families use one head size")
    rope_dims = m.int("rope.dimension_count", head_dim)
    if head_dim <= 0 or not 0 < rope_dims <= head_dim:
        raise ModelFormatError(path, f"{arch}.rope.dimension_count = {rope_dims} must be in "
                                     f"1..head_dim ({head_dim})")

    cfg = ModelConfig(
        family=family,
        vocab_size=_gguf_vocab_size(m, meta, shapes),
        hidden_size=hidden,
        num_hidden_layers=n_layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=m.int("feed_forward_length", 0, uniform=True),
        rms_norm_eps=m.float("attention.layer_norm_rms_epsilon"),
        rope_theta=m.float("rope.freq_base", 10000.0),
        max_position_embeddings=m.int("context_length"),
        tie_word_embeddings="output.weight" not in shapes,
        partial_rotary_factor=rope_dims / head_dim,
        attention_bias=family == "qwen2",
        qk_norm=family != "qwen2",
        attn_output_gate=family in HYBRID_FAMILIES,
        layer_types=[FULL_ATTENTION] * n_layers,
        mtp_num_hidden_layers=mtp,
        rope_scaling=_gguf_rope_scaling(m),
        source=path,
    )
    if family in HYBRID_FAMILIES:
        interval = m.int("full_attention_interval", 4)     # llama.cpp's default
        if interval <= 0:
            raise ModelFormatError(path, f"{arch}.full_attention_interval = {interval} must be positive")
        v_heads = m.int("ssm.time_step_rank")
        inner = m.int("ssm.inner_size")
        if v_heads <= 0 or inner % v_heads:
            raise ModelFormatError(path, f"{arch}.ssm.inner_size = {inner} is not a multiple of "
                                         f"{arch}.ssm.time_step_rank = {v_heads}")
        cfg.layer_types = layer_types_from_interval(n_layers, interval)
        cfg.linear_conv_kernel_dim = m.int("ssm.conv_kernel")
        cfg.linear_key_head_dim = m.int("ssm.state_size")
        cfg.linear_num_key_heads = m.int("ssm.group_count")
        cfg.linear_num_value_heads = v_heads
        cfg.linear_value_head_dim = inner // v_heads
    if family in MOE_FAMILIES:
        cfg.num_experts = m.int("expert_count")
        cfg.num_experts_per_tok = m.int("expert_used_count")
        cfg.moe_intermediate_size = m.int("expert_feed_forward_length")
        cfg.shared_expert_intermediate_size = m.int("expert_shared_feed_forward_length", 0)
        norm = meta.get(m.key("expert_weights_norm"), True)   # llama.cpp normalises for these archs
        if not isinstance(norm, bool):
            raise ModelFormatError(path, f"{m.key('expert_weights_norm')} = {norm!r} should be a bool")
        cfg.norm_topk_prob = norm
        # GGUF has no key for dense layers inside a MoE stack; the tensors say which they are.
        cfg.mlp_only_layers = [i for i in range(n_layers)
                               if f"blk.{i}.ffn_down.weight" in shapes
                               and f"blk.{i}.ffn_down_exps.weight" not in shapes]
    _gguf_token_ids(cfg, m)
    return validate_config(cfg, path)


def _gguf_vocab_size(m: _Meta, meta: dict, shapes: dict) -> int:
    if m.key("vocab_size") in meta:
        return m.int("vocab_size")
    # The embedding's rows are what the model computes with; the token list may be shorter.
    if "token_embd.weight" in shapes and len(shapes["token_embd.weight"]) == 2:
        return shapes["token_embd.weight"][0]
    tokens = meta.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list) and tokens:
        return len(tokens)
    raise ModelFormatError(m.path, f"cannot tell the vocabulary size: no {m.key('vocab_size')} key, "
                                   f"no token_embd.weight tensor and no tokenizer.ggml.tokens list")


def _gguf_rope_scaling(m: _Meta) -> dict:
    kind = m.meta.get(m.key("rope.scaling.type"))
    if kind in (None, "none", ""):
        return {}
    if not isinstance(kind, str):
        raise ModelFormatError(m.path, f"{m.key('rope.scaling.type')} = {kind!r} should be a string")
    out = {"rope_type": kind, "factor": m.float("rope.scaling.factor", 1.0)}
    orig = m.int("rope.scaling.original_context_length", 0)
    if orig:
        out["original_max_position_embeddings"] = orig
    return out


def _gguf_token_ids(cfg: ModelConfig, m: _Meta) -> None:
    ids = {}
    for kind in ("bos", "eos", "eot", "eom"):
        key = f"tokenizer.ggml.{kind}_token_id"
        if key in m.meta:
            ids[kind] = m.int(key, full_key=True)
    cfg.bos_token_id = ids.get("bos")
    cfg.eos_token_id = ids.get("eos")
    cfg.eos_token_ids = []
    for kind in ("eos", "eot", "eom"):
        if kind in ids and ids[kind] not in cfg.eos_token_ids:
            cfg.eos_token_ids.append(ids[kind])
