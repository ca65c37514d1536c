"""bw24nb.quant: the CPU reference codecs.

Oracles, in order of independence:
- gguf-py's quants module (gguf.quants), an independent numpy port of ggml: our decoders must
  equal it bit for bit on random blocks; our Q4_0/Q5_0/Q5_1/Q8_0/BF16/F16 encoders byte for byte.
- first-principles formulas for the small float formats (sign / exponent / mantissa), written
  here with Python's math.ldexp, and brute-force nearest-value searches for the encoders.
- error bounds derived from each format's definition for the encoders gguf cannot check.
"""
import math

import gguf
import gguf.quants as gq
import numpy as np
import pytest

from bw24nb.errors import UnsupportedTensorType
from bw24nb.quant import (QType, QuantFormatError, block_size, decode_modelopt_nvfp4, dequantize,
                          float_to_fp4_e2m1, float_to_fp8_e4m3, float_to_ue4m3_ggml,
                          fp4_e2m1_table, fp8_e4m3_table, fp8_e4m3_to_float,
                          gguf_nvfp4_to_modelopt, modelopt_nvfp4_to_gguf, quantize,
                          quantize_activations_q8, quantize_modelopt_nvfp4, row_bytes, type_size,
                          ue4m3_to_float)
from bw24nb.quant import codec

GGUF_TYPES = [t for t in QType if t != QType.FP8_E4M3]
BLOCK_TYPES = [QType.Q4_0, QType.Q5_0, QType.Q5_1, QType.Q8_0, QType.Q4_K, QType.Q5_K,
               QType.Q6_K, QType.NVFP4]
# types whose gguf-py encoder mirrors llama.cpp's reference quantizer
GGUF_ENCODABLE = [QType.Q4_0, QType.Q5_0, QType.Q5_1, QType.Q8_0, QType.BF16, QType.F16]

# byte offsets of the f16 fields in each block (ggml-common.h)
F16_FIELDS = {QType.Q4_0: [0], QType.Q5_0: [0], QType.Q5_1: [0, 2], QType.Q8_0: [0],
              QType.Q4_K: [0, 2], QType.Q5_K: [0, 2], QType.Q6_K: [208]}


def _gguf(qt):
    return gguf.GGMLQuantizationType(int(qt))


def _bits(a):
    return np.asarray(a, dtype=np.float32).view(np.uint32)


def _random_finite_f16(rng, n):
    bits = rng.integers(0, 1 << 16, n, dtype=np.uint32)
    inf_nan = ((bits >> 10) & 31) == 31
    bits = np.where(inf_nan, bits & ~np.uint32(1 << 14), bits)     # exponent 31 -> 15: finite
    return bits.astype("<u2").view(np.uint8).reshape(n, 2)


def _random_blocks(rng, qt, n_blocks):
    raw = rng.integers(0, 256, (n_blocks, type_size(qt)), dtype=np.uint8)
    for off in F16_FIELDS.get(qt, []):
        raw[:, off:off + 2] = _random_finite_f16(rng, n_blocks)
    return raw


def _f16_at(raw_blocks, off):
    return np.ascontiguousarray(raw_blocks[:, off:off + 2]).view("<f2").astype(np.float64)


def _test_rows(rng, n_rows, n):
    """Rows with per-row magnitudes from 1e-4 to 1e2, some all-positive / all-negative /
    constant / zero / single-outlier rows."""
    x = rng.standard_normal((n_rows, n)) * 10.0 ** rng.uniform(-4, 2, (n_rows, 1))
    x[0] = 0.0
    x[1] = np.abs(x[1])
    x[2] = -np.abs(x[2])
    x[3] = 0.37
    x[4, :] = rng.standard_normal(n) * 1e-3
    x[4, rng.integers(n)] = 50.0
    return x.astype(np.float32)


# ---------------------------------------------------------------- geometry and errors


def test_geometry_matches_gguf_and_fp8_is_one_byte():
    for qt in GGUF_TYPES:
        assert (block_size(qt), type_size(qt)) == gguf.GGML_QUANT_SIZES[_gguf(qt)]
        assert qt.name == _gguf(qt).name
    assert (block_size(QType.FP8_E4M3), type_size(QType.FP8_E4M3)) == (1, 1)
    assert row_bytes(QType.Q4_K, 4096) == 16 * 144
    assert row_bytes(int(QType.NVFP4), 128) == 72
    assert block_size(gguf.GGMLQuantizationType.Q6_K) == 256


def test_row_length_not_a_whole_number_of_blocks_raises():
    with pytest.raises(QuantFormatError, match="multiple of 256"):
        row_bytes(QType.Q4_K, 300)
    with pytest.raises(QuantFormatError):
        quantize(np.zeros((2, 48), np.float32), QType.Q8_0)
    with pytest.raises(QuantFormatError):
        dequantize(np.zeros(34, np.uint8), QType.Q8_0, (1, 48))


@pytest.mark.parametrize("bad", [3, 16, 39, 999, gguf.GGMLQuantizationType.IQ4_XS])
def test_unknown_types_raise_unsupported_tensor_type(bad):
    with pytest.raises(UnsupportedTensorType):
        block_size(bad)
    with pytest.raises(UnsupportedTensorType):
        dequantize(np.zeros(18, np.uint8), bad, (1, 32))
    with pytest.raises(UnsupportedTensorType):
        quantize(np.zeros((1, 32), np.float32), bad)


@pytest.mark.parametrize("qt", list(QType), ids=lambda t: t.name)
def test_wrong_byte_count_raises(qt, rng):
    shape = (3, 2 * block_size(qt))
    n = 3 * row_bytes(qt, shape[1])
    for wrong in (n - 1, n + type_size(qt), 0):
        with pytest.raises(QuantFormatError, match="bytes"):
            dequantize(rng.integers(0, 256, wrong, dtype=np.uint8), qt, shape)


def test_non_uint8_raw_raises():
    with pytest.raises(QuantFormatError, match="uint8"):
        dequantize(np.zeros(4, np.float32), QType.F32, (4,))


def test_raw_may_be_bytes_memoryview_or_row_shaped(rng):
    raw = _random_blocks(rng, QType.Q4_K, 6)
    want = dequantize(raw.reshape(-1), QType.Q4_K, (2, 768))
    for form in (raw, raw.reshape(2, -1), raw.tobytes(), memoryview(raw.tobytes()),
                 bytearray(raw.tobytes())):
        assert np.array_equal(dequantize(form, QType.Q4_K, (2, 768)), want)
    assert dequantize(raw, QType.Q4_K, [2, 3, 256]).shape == (2, 3, 256)


# ---------------------------------------------------------------- decoders == gguf-py


@pytest.mark.parametrize("qt", GGUF_TYPES, ids=lambda t: t.name)
def test_dequantize_equals_gguf_bit_for_bit(qt, rng):
    n_rows, blocks_per_row = int(rng.integers(1, 40)), int(rng.integers(1, 9))
    raw = _random_blocks(rng, qt, n_rows * blocks_per_row)
    shape = (n_rows, blocks_per_row * block_size(qt))
    ours = dequantize(raw, qt, shape)
    theirs = gq.dequantize(raw.reshape(n_rows, -1), _gguf(qt)).astype(np.float32)
    assert ours.dtype == np.float32 and ours.shape == shape
    assert np.array_equal(_bits(ours), _bits(theirs))       # NaN payloads and -0.0 included


def test_chunked_decode_and_encode_equal_one_shot(rng, monkeypatch):
    x = rng.standard_normal((7, 512)).astype(np.float32)
    whole = {qt: quantize(x, qt) for qt in (QType.Q4_K, QType.NVFP4, QType.Q5_0)}
    monkeypatch.setattr(codec, "_CHUNK_VALUES", 300)       # chunk edges inside rows
    for qt, raw in whole.items():
        assert np.array_equal(quantize(x, qt), raw)
        assert np.array_equal(_bits(dequantize(raw, qt, x.shape)),
                              _bits(gq.dequantize(raw, _gguf(qt))))


# ---------------------------------------------------------------- encoders == llama.cpp reference


@pytest.mark.parametrize("qt", GGUF_ENCODABLE, ids=lambda t: t.name)
def test_quantize_is_byte_identical_to_llama_cpp_reference(qt, rng):
    x = _test_rows(rng, 24, 256)
    x[5, :32] = np.linspace(-1, 1, 32)       # exact ties of |max| (first one wins)
    # blocks whose scale is exactly +-1 (max 127 for Q8_0, -8 for Q4_0, -16 for Q5_0), so
    # x * (1/d) lands exactly on .5: roundf's half-away-from-zero and trunc(x + 8.5) are exercised
    x[5, 32:64] = np.r_[127, np.arange(-14.5, 15.5), 0.5]
    x[5, 64:96] = np.r_[-8, np.arange(-7.5, 8), np.full(15, 0.5)]
    x[5, 96:128] = np.r_[-16, np.arange(-15.5, 15.5)]
    x[6, :32] = np.float32(2.0 ** -20)       # d in f16's subnormal range
    ours = quantize(x, qt)
    theirs = np.ascontiguousarray(gq.quantize(x, _gguf(qt))).view(np.uint8).reshape(ours.shape)
    assert ours.shape == (24, row_bytes(qt, 256))
    assert np.array_equal(ours, theirs)


def test_zero_block_scale_sign_follows_the_c_loop():
    # quantize_row_q4_0_ref starts from max = 0.0f and replaces it only on a strictly larger
    # |v|, so any all-zero block (even all -0.0) gets d = 0.0f / -8 = -0.0 (f16 bytes 00 80).
    # (gguf-py takes the first element instead and would give +0.0 for a block of -0.0.)
    for qt in (QType.Q4_0, QType.Q5_0):
        for z in (0.0, -0.0):
            raw = quantize(np.full((1, 32), z, np.float32), qt)
            assert list(raw[0, :2]) == [0x00, 0x80]


def test_bf16_nan_and_inf_follow_ggml():
    x = np.array([[np.nan, -np.nan, np.inf, -np.inf, 3.0e38, 1.0 + 2.0 ** -8]], np.float32)
    x = np.concatenate([x, np.float32(np.nan) * np.ones((1, 6), np.float32)])
    ours = quantize(x, QType.BF16)
    assert np.array_equal(ours, gq.quantize(x, gguf.GGMLQuantizationType.BF16).view(np.uint8)
                          .reshape(ours.shape))
    back = dequantize(ours, QType.BF16, x.shape)
    assert np.isnan(back[0, :2]).all() and back[0, 2] == np.inf and back[0, 3] == -np.inf
    assert back[0, 5] == 1.0                                  # a tie rounds to even


def test_block_encoders_reject_non_finite_input():
    for qt in BLOCK_TYPES:
        x = np.zeros((1, block_size(qt)), np.float32)
        x[0, 3] = np.nan
        with pytest.raises(QuantFormatError, match="NaN"):
            quantize(x, qt)


# ---------------------------------------------------------------- encoder round-trip bounds
# Each bound is half a quantization step of the *stored* scale, plus what rounding that scale to
# f16 costs (|q| * |d - d16|), plus float32 rounding slack (a few ulps).

EPS32 = 2.0 ** -23


def _legacy_ref_scale(x, qt):
    """The unrounded float32 scale llama.cpp derives for each 32-block."""
    b = x.reshape(-1, 32).astype(np.float64)
    if qt == QType.Q8_0:
        return np.abs(b).max(axis=1) / 127
    if qt == QType.Q5_1:
        return (b.max(axis=1) - b.min(axis=1)) / 31
    imax = np.take_along_axis(b, np.abs(b).argmax(axis=1)[:, None], axis=1)[:, 0]
    return imax / (-8 if qt == QType.Q4_0 else -16)


@pytest.mark.parametrize("qt", [QType.Q4_0, QType.Q5_0, QType.Q5_1, QType.Q8_0],
                         ids=lambda t: t.name)
def test_legacy_round_trip_bound(qt, rng):
    x = _test_rows(rng, 32, 256)
    raw = quantize(x, qt)
    back = gq.dequantize(raw, _gguf(qt)).reshape(-1, 32).astype(np.float64)
    blocks = raw.reshape(-1, type_size(qt))
    xb = x.reshape(-1, 32).astype(np.float64)
    d = _legacy_ref_scale(x, qt)[:, None]
    d16 = _f16_at(blocks, 0)
    err = np.abs(back - xb)
    if qt == QType.Q8_0:          # q = round(x / d) in -127..127: half a step, no clipping
        bound = np.abs(d) / 2 + 127 * np.abs(d - d16)
    elif qt == QType.Q5_1:        # q = round((x - min) / d) in 0..31; min is stored as f16 too
        m16 = _f16_at(blocks, 2)
        bound = d / 2 + 31 * np.abs(d - d16) + np.abs(xb.min(axis=1, keepdims=True) - m16)
    else:
        # q = round(x / d) + offset with d = max / -offset: the block's max lands exactly on
        # q = 0, but -max would need q = 2 * offset, one past the top: clipped, one full step.
        levels = 8 if qt == QType.Q4_0 else 16
        half = np.where(xb / np.where(d == 0, 1, d) > levels - 0.5, 1.0, 0.5)
        bound = half * np.abs(d) + levels * np.abs(d - d16)
    assert (err <= bound + 4 * EPS32 * (np.abs(xb) + np.abs(d))).all()


def _k_subblocks(x, qt):
    return x.reshape(-1, 16 if qt == QType.Q6_K else 32).astype(np.float64)


@pytest.mark.parametrize("qt", [QType.Q4_K, QType.Q5_K, QType.Q6_K], ids=lambda t: t.name)
def test_k_quant_round_trip_bound(qt, rng):
    x = _test_rows(rng, 24, 512)
    x[7] = rng.uniform(0.5, 2.0, 512).astype(np.float32)           # offset far from zero
    x[8] = np.float32(1e-9) * rng.standard_normal(512).astype(np.float32)   # f16 subnormal d
    raw = quantize(x, qt)
    assert raw.shape == (24, row_bytes(qt, 512))
    back = gq.dequantize(raw, _gguf(qt)).astype(np.float64)       # decoded independently
    blocks = raw.reshape(-1, type_size(qt))
    n_sub = 16 if qt == QType.Q6_K else 8
    xs = _k_subblocks(x, qt)
    err = np.abs(back.reshape(xs.shape) - xs)

    if qt == QType.Q6_K:
        d = _f16_at(blocks, 208)
        sc = blocks[:, 192:208].view(np.int8).astype(np.float64)
        step = (d * sc).reshape(-1, 1)
        # the ideal step fits +-amax into the 31 positive levels; ours is at most one d above it
        ideal = np.abs(xs).max(axis=1, keepdims=True) / 31
        extra = np.repeat(d, n_sub, axis=0)
    else:
        d, dmin = _f16_at(blocks, 0), _f16_at(blocks, 2)
        sc, _ = gq.Q4_K.get_scale_min(blocks[:, 4:16])
        step = (d * sc.astype(np.float64)).reshape(-1, 1)
        levels = 15 if qt == QType.Q4_K else 31
        # value = step * q - offset, offset = dmin * m rounded up to cover min(0, min x):
        # the range to cover is max(x) - min(0, min x) plus at most one dmin of offset slack
        rng_j = xs.max(axis=1, keepdims=True) - np.minimum(xs.min(axis=1, keepdims=True), 0)
        ideal = (rng_j + np.repeat(dmin, n_sub, axis=0)) / levels
        extra = np.repeat(d, n_sub, axis=0)
    slack = 4 * EPS32 * (np.abs(xs) + step)
    # every element within half its sub-block's step: nothing was clipped ...
    assert (err <= step / 2 + slack).all()
    # ... and the step is the ideal one, rounded up by at most one super-block unit d
    assert (step <= (ideal + extra) * (1 + 2 * EPS32)).all()


def test_k_quant_scale_overflow_raises():
    x = np.full((1, 256), 1e9, np.float32)
    for qt in (QType.Q4_K, QType.Q5_K, QType.Q6_K):
        with pytest.raises(QuantFormatError, match="too large"):
            quantize(x, qt)


def test_all_zero_blocks_round_trip_to_zero():
    for qt in BLOCK_TYPES:
        x = np.zeros((2, 256 if block_size(qt) <= 256 else block_size(qt)), np.float32)
        assert not dequantize(quantize(x, qt), qt, x.shape).any()


# ---------------------------------------------------------------- F32 / F16 / BF16 / FP8 types


def test_float_types_are_exact(rng):
    x = (rng.standard_normal((5, 64)) * 10.0 ** rng.uniform(-30, 30, (5, 64))).astype(np.float32)
    assert np.array_equal(_bits(dequantize(quantize(x, QType.F32), QType.F32, x.shape)), _bits(x))
    with np.errstate(over="ignore"):
        h = x.astype(np.float16).astype(np.float32)           # f16-representable values (and inf)
    assert np.array_equal(_bits(dequantize(quantize(h, QType.F16), QType.F16, h.shape)), _bits(h))
    b = (x.view(np.uint32) & 0xFFFF0000).view(np.float32)     # bf16-representable values
    assert np.array_equal(_bits(dequantize(quantize(b, QType.BF16), QType.BF16, b.shape)), _bits(b))
    e = fp8_e4m3_table()[rng.integers(0, 256, (5, 64))]
    e[np.isnan(e)] = 1.0
    assert np.array_equal(_bits(dequantize(quantize(e, QType.FP8_E4M3), QType.FP8_E4M3, e.shape)),
                          _bits(e))


# ---------------------------------------------------------------- small float formats


def _fp8_formula(c):
    s, e, m = c >> 7, (c >> 3) & 15, c & 7
    if e == 15 and m == 7:
        return math.nan
    v = math.ldexp(m / 8, -6) if e == 0 else math.ldexp(1 + m / 8, e - 7)
    return -v if s else v


def _fp4_formula(c):
    s, e, m = c >> 3, (c >> 1) & 3, c & 1
    v = m * 0.5 if e == 0 else math.ldexp(1 + m / 2, e - 1)
    return -v if s else v


def test_fp8_e4m3_table_matches_formula_for_all_codes():
    t = fp8_e4m3_table()
    assert t.dtype == np.float32 and t.shape == (256,)
    assert [c for c in range(256) if math.isnan(t[c])] == [0x7F, 0xFF]
    for c in range(256):
        f = _fp8_formula(c)
        assert math.isnan(f) or (t[c] == f and math.copysign(1, t[c]) == math.copysign(1, f)), c
    assert t[0x7E] == 448.0 and t[0x01] == 2.0 ** -9 and t[0x08] == 2.0 ** -6
    assert np.array_equal(_bits(fp8_e4m3_to_float(np.arange(256, dtype=np.uint8))), _bits(t))


def test_fp4_e2m1_table_matches_formula():
    t = fp4_e2m1_table()
    assert t.dtype == np.float32 and t.shape == (16,)
    for c in range(16):
        f = _fp4_formula(c)
        assert t[c] == f and math.copysign(1, t[c]) == math.copysign(1, f)
    assert np.array_equal(2 * t, [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12])


def _nearest_even_bruteforce(x, mags, sign_code):
    """Nearest of the magnitudes `mags` (code i = index i) by exhaustive search, ties to the
    even code, saturating at the largest; negative inputs get `sign_code` or'ed in."""
    mags = np.asarray(mags, dtype=np.float64)
    out = []
    for v in np.asarray(x, np.float64):
        diff = np.abs(mags - min(abs(v), mags[-1]))
        best = np.flatnonzero(diff == diff.min())
        code = int(best[0] if len(best) == 1 else best[best % 2 == 0][0])
        out.append(code | (sign_code if math.copysign(1, v) < 0 else 0))
    return np.array(out, dtype=np.uint8)


def test_float_to_fp8_e4m3_rounds_to_nearest_even_and_saturates(rng):
    t = fp8_e4m3_table()
    finite = [c for c in range(256) if not math.isnan(t[c])]
    assert np.array_equal(float_to_fp8_e4m3(t[finite]), np.array(finite, np.uint8))
    pos = t[:127].astype(np.float64)
    mids = ((pos[:-1] + pos[1:]) / 2).astype(np.float32)      # exact in float32
    codes = np.arange(126)
    assert np.array_equal(float_to_fp8_e4m3(mids), np.where(codes % 2 == 0, codes, codes + 1))
    above = np.nextafter(mids, np.float32(np.inf))
    below = np.nextafter(mids, np.float32(0))
    assert np.array_equal(float_to_fp8_e4m3(above), codes + 1)
    assert np.array_equal(float_to_fp8_e4m3(below), codes)
    assert np.array_equal(float_to_fp8_e4m3(-above), (codes + 1) | 0x80)
    x = (rng.standard_normal(3000) * 10.0 ** rng.uniform(-4, 3, 3000)).astype(np.float32)
    assert np.array_equal(float_to_fp8_e4m3(x), _nearest_even_bruteforce(x, t[:127], 0x80))
    sat = float_to_fp8_e4m3(np.array([448, 464, 1e30, np.inf, -np.inf, -1e6], np.float32))
    assert list(sat) == [0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0xFE]
    assert float_to_fp8_e4m3(np.float32(-0.0)) == 0x80
    with pytest.raises(QuantFormatError):
        float_to_fp8_e4m3(np.array([1.0, np.nan], np.float32))


def test_fp8_e4m3_agrees_with_torch(rng):
    torch = pytest.importorskip("torch")
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    theirs = codes.view(torch.float8_e4m3fn).float().numpy()
    ok = ~np.isnan(theirs)
    assert np.array_equal(_bits(fp8_e4m3_table())[ok], _bits(theirs)[ok])
    assert np.array_equal(np.isnan(fp8_e4m3_table()), np.isnan(theirs))
    x = (rng.standard_normal(20000) * 10.0 ** rng.uniform(-5, 2.6, 20000)).astype(np.float32)
    x = x[np.abs(x) < 448]           # torch's cast is not saturating above 448
    assert np.array_equal(float_to_fp8_e4m3(x),
                          torch.from_numpy(x).to(torch.float8_e4m3fn).view(torch.uint8).numpy())


def test_float_to_fp4_e2m1_rounds_to_nearest_even(rng):
    t = fp4_e2m1_table()
    assert np.array_equal(float_to_fp4_e2m1(t[:8]), np.arange(8))
    assert np.array_equal(float_to_fp4_e2m1(t[9:]), np.arange(9, 16))
    # midpoints: 0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2.0, 2.5 -> 2, 3.5 -> 4, 5 -> 4
    mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], np.float32)
    assert list(float_to_fp4_e2m1(mids)) == [0, 2, 2, 4, 4, 6, 6]
    assert list(float_to_fp4_e2m1(np.array([7, 1e9, -np.inf], np.float32))) == [7, 7, 15]
    assert float_to_fp4_e2m1(np.float32(-0.1)) == 8           # modelopt's sign bit: x < 0
    x = rng.uniform(-7, 7, 2000).astype(np.float32)
    want = _nearest_even_bruteforce(x, t[:8], 8)
    assert np.array_equal(float_to_fp4_e2m1(x), want)


def test_ue4m3_decode_matches_ggml_formula_for_all_bytes():
    # ggml_ue4m3_to_fp32(x) * 2: 0x00 and 0x7F are 0, bit 7 ignored, exponent 15 is normal
    for b in range(256):
        e, m = (b >> 3) & 15, b & 7
        want = 0.0 if b in (0, 0x7F) else (
            math.ldexp(m, -9) if e == 0 else math.ldexp(1 + m / 8, e - 7))
        assert ue4m3_to_float(np.uint8(b)) == want, hex(b)
    assert ue4m3_to_float(np.uint8(0xFF)) == 480.0


def test_ue4m3_encoder_matches_gguf_port_of_ggml(rng):
    x = (np.abs(rng.standard_normal(50000)) * 10.0 ** rng.uniform(-5, 3, 50000)).astype(np.float32)
    edges = np.array([0, -1, 448, 500, 300, 255.9, 256, 2.0 ** -6, 2.0 ** -7, 7.5 / 512,
                      7.49 / 512, 0.5 / 512, 0.49 / 512, np.inf, 1.0625, 1.0624], np.float32)
    x = np.concatenate([x, edges])
    assert np.array_equal(float_to_ue4m3_ggml(x), gq.NVFP4.fp32_to_ue4m3(x))
    assert float_to_ue4m3_ggml(np.float32(np.nan)) == 0        # C: !(x > 0) -> 0


# ---------------------------------------------------------------- GGUF NVFP4 encoder


def _nvfp4_ref_block(x64):
    """quantize_row_nvfp4_ref for one 64-value block, as scalar loops (scale byte via gguf-py's
    port of ggml_fp32_to_ue4m3, decode via its ue4m3_to_fp32)."""
    kvalues = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12]
    out = bytearray(36)
    for s in range(4):
        xb = x64[16 * s: 16 * s + 16]
        amax = np.float32(0)
        for v in xb:
            amax = max(amax, np.abs(v))
        ue = int(gq.NVFP4.fp32_to_ue4m3(np.array([amax / np.float32(6)], np.float32))[0])
        d = np.float32(gq.NVFP4.ue4m3_to_fp32(np.array([ue], np.uint8))[0])
        out[s] = ue

        def best(v):
            errs = [np.abs(np.float32(k) * d - v) for k in kvalues]
            return min(range(16), key=lambda i: (errs[i], i))
        for j in range(8):
            out[4 + 8 * s + j] = best(xb[j]) | (best(xb[j + 8]) << 4)
    return bytes(out)


def test_nvfp4_quantize_equals_llama_cpp_reference(rng):
    x = _test_rows(rng, 6, 128)
    x[5, :64] = np.array([0.25, 0.75, -1.25, 2.5, 5, -5, 0.0, 6] * 8, np.float32)   # ties
    ours = quantize(x, QType.NVFP4)
    for r in range(6):
        for b in range(2):
            want = _nvfp4_ref_block(x[r, 64 * b: 64 * b + 64])
            assert bytes(ours[r, 36 * b: 36 * b + 36]) == want


def test_nvfp4_round_trip_bound(rng):
    # sub-block amax / 6 kept in [2^-6, 256), where ggml's scale encoder is plain round-half-up:
    # the scale s is within 1/16 of amax/6, so values beyond 6s clip by at most amax/16 < s, and
    # the others land within half the largest E2M1 gap (2, between 4 and 6) times s.
    mag = 10.0 ** rng.uniform(-0.5, 2.5, (16, 16)).repeat(16, axis=1)
    x = rng.uniform(-1, 1, (16, 256)) * mag
    x[:, ::16] = np.where(rng.random((16, 16)) < 0.5, -1, 1) * mag[:, ::16]   # amax = mag
    x = x.astype(np.float32)
    raw = quantize(x, QType.NVFP4)
    back = gq.dequantize(raw, gguf.GGMLQuantizationType.NVFP4).astype(np.float64)
    s = ue4m3_to_float(raw.reshape(-1, 36)[:, :4]).astype(np.float64)
    s = s.reshape(16, -1).repeat(16, axis=1)
    assert (np.abs(back - x) <= s * (1 + 4 * EPS32)).all()


# ---------------------------------------------------------------- modelopt NVFP4


def _modelopt_oracle(packed, scale, ts):
    """Element i of a row: nibble i % 2 of byte i // 2 (low first), times the E4M3 scale of
    block i // 16, times the tensor scale, all from the formulas above."""
    fp4 = np.array([abs(_fp4_formula(c)) * (-1 if c & 8 and c != 8 else 1) for c in range(16)])
    fp8 = np.array([_fp8_formula(c) for c in range(256)])
    rows, k = packed.shape[0], packed.shape[1] * 2
    i = np.arange(k)
    codes = (packed[:, i // 2] >> (4 * (i % 2))) & 15
    exact = fp4[codes] * fp8[scale[:, i // 16]]                    # exact in float64 and float32
    return (exact.astype(np.float32) * np.float32(ts)).reshape(rows, k)


def _random_modelopt(rng, rows, k):
    packed = rng.integers(0, 256, (rows, k // 2), dtype=np.uint8)
    scale = rng.integers(0, 0x7F, (rows, k // 16), dtype=np.uint8)    # positive, non-NaN E4M3
    return packed, scale, np.float32(rng.uniform(1e-4, 1e-1))


def test_decode_modelopt_matches_first_principles(rng):
    packed, scale, ts = _random_modelopt(rng, 5, 128)
    ours = decode_modelopt_nvfp4(packed, scale, ts)
    assert ours.shape == (5, 128) and ours.dtype == np.float32
    assert np.array_equal(_bits(ours), _bits(_modelopt_oracle(packed, scale, ts)))
    assert np.array_equal(decode_modelopt_nvfp4(packed, scale, np.array([ts])), ours)


def test_modelopt_to_gguf_repack_is_lossless(rng):
    packed, scale, ts = _random_modelopt(rng, 9, 192)
    raw = modelopt_nvfp4_to_gguf(packed, scale)
    assert raw.shape == (9, row_bytes(QType.NVFP4, 192))
    # GGUF's reading of the repacked bytes, times the separate tensor scale, is modelopt's value
    gg = gq.dequantize(raw, gguf.GGMLQuantizationType.NVFP4).astype(np.float32)
    assert np.array_equal(_bits(gg * ts), _bits(decode_modelopt_nvfp4(packed, scale, ts)))
    assert np.array_equal(_bits(dequantize(raw, QType.NVFP4, (9, 192))), _bits(gg))
    # and the inverse gives back the very same bytes
    p2, s2 = gguf_nvfp4_to_modelopt(raw, 192)
    assert np.array_equal(p2, packed) and np.array_equal(s2, scale)
    # leading axes (stacked experts) repack row by row
    stacked = modelopt_nvfp4_to_gguf(packed[None].repeat(2, 0), scale[None].repeat(2, 0))
    assert np.array_equal(stacked[1], raw)


def test_modelopt_repack_rejects_what_gguf_cannot_hold(rng):
    packed, scale, _ = _random_modelopt(rng, 2, 64)
    with pytest.raises(QuantFormatError, match="multiple of 64"):
        modelopt_nvfp4_to_gguf(packed[:, :16], scale[:, :2])
    for bad in (0x7F, 0x88):
        s = scale.copy()
        s[1, 2] = bad
        with pytest.raises(QuantFormatError, match="negative or NaN"):
            modelopt_nvfp4_to_gguf(packed, s)
    with pytest.raises(QuantFormatError, match="weight_scale"):
        modelopt_nvfp4_to_gguf(packed, scale[:, :3])


def test_quantize_modelopt_round_trip_bound(rng):
    x = (rng.standard_normal((8, 256)) * 10.0 ** rng.uniform(-3, 1, (8, 16)).repeat(16, axis=1))
    x = x.astype(np.float32)
    packed, scale, ts = quantize_modelopt_nvfp4(x)
    assert packed.shape == (8, 128) and scale.shape == (8, 16) and ts.dtype == np.float32
    assert ts == np.float32(np.abs(x).max() / np.float32(2688.0))
    assert not (scale & 0x80).any() and (scale >= 1).all()          # positive, >= 2^-9
    back = decode_modelopt_nvfp4(packed, scale, ts).astype(np.float64)
    # step s * ts per block: E2M1's largest half-gap is 1 step; the E4M3 scale is within 1/16
    # of amax / (6 ts) (or 2^-10 absolute in its subnormal range), so clipping past 6 steps
    # costs at most amax/16 < 1 step, or 6 * 2^-10 * ts for subnormal scales
    s = fp8_e4m3_to_float(scale).astype(np.float64).repeat(16, axis=1)
    assert (np.abs(back - x) <= (s + 6 * 2.0 ** -10) * ts * (1 + 1e-5)).all()
    assert not decode_modelopt_nvfp4(*quantize_modelopt_nvfp4(np.zeros((2, 32), np.float32))).any()


# ---------------------------------------------------------------- activation quantization


def test_activation_q8_is_llama_cpp_q8_0_with_float32_scale(rng):
    x = _test_rows(rng, 10, 256).reshape(2, 5, 256)
    q, d = quantize_activations_q8(x)
    assert q.dtype == np.int8 and q.shape == x.shape
    assert d.dtype == np.float32 and d.shape == (2, 5, 8)
    # f16(d) followed by q is llama.cpp's block_q8_0, byte for byte
    blocks = np.concatenate([d.reshape(-1, 1).astype("<f2").view(np.uint8),
                             q.reshape(-1, 32).view(np.uint8)], axis=1)
    assert np.array_equal(blocks.reshape(2, 5, -1), quantize(x, QType.Q8_0))
    assert np.array_equal(blocks.reshape(10, -1),
                          gq.quantize(x.reshape(10, 256), gguf.GGMLQuantizationType.Q8_0))
    dd = d.astype(np.float64).repeat(32, axis=-1)
    assert (np.abs(q * dd - x) <= dd / 2 * (1 + 1e-6)).all()
    assert np.array_equal(d, np.abs(x).reshape(2, 5, 8, 32).max(-1) / np.float32(127))
    with pytest.raises(QuantFormatError):
        quantize_activations_q8(np.zeros((2, 40), np.float32))
