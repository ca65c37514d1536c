"""Bytes a decode step must read: the roofline every decode tok/s is divided by.

    weights  every tensor the step multiplies with, read once: all matrices of the main stack
             and the LM head; of the token embedding only the one row it looks up (unless the
             LM head is tied to it, then all of it); of stacked experts only the top-k share
             (k / E of each `*_exps` tensor); the MTP block not at all (plain decode).
    KV       every full-attention layer reads K and V of all `ctx` cached positions in the
             engine's cache types (default F16: 2 B a value; `--kv-cache q8`: K Q8_0 = 34 B
             per 32 values, V Q5_1 = 24 B).
    state    every Gated DeltaNet layer reads its recurrent state S [n_v, d_k, d_v] and its conv
             window [(kernel - 1), channels] (float32). The step writes them back too; that
             write traffic (~the same bytes) is not in the read roofline.

decode tok/s ceiling = read bandwidth / (weights + KV + state); "% of roofline" is the measured
rate over that ceiling.
"""
from __future__ import annotations

from dataclasses import dataclass

from bw24nb.cache.kv import K_TYPE_DEFAULT, V_TYPE_DEFAULT
from bw24nb.formats.config import FULL_ATTENTION, LINEAR_ATTENTION
from bw24nb.quant import row_bytes

K_TYPE, V_TYPE = K_TYPE_DEFAULT, V_TYPE_DEFAULT     # when the caller does not say
STATE_BYTES = 4            # float32 recurrent / conv state


@dataclass(frozen=True)
class DecodeBytes:
    weights: int
    kv: int
    state: int

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.state


def weight_bytes_per_token(source) -> int:
    """Weight bytes one decode step reads from a TensorSource (GGUF internal names)."""
    c = source.config
    tied = not source.has("output.weight")
    total = 0
    for name in source.names():
        info = source.info(name)
        if name.startswith("blk."):
            if int(name.split(".")[1]) >= c.num_hidden_layers:
                continue                                  # MTP block: not in plain decode
            if "_exps." in name:
                total += info.nbytes * c.num_experts_per_tok // max(c.num_experts, 1)
                continue
        if name == "token_embd.weight" and not tied:
            total += info.nbytes // info.shape[0]         # one row
            continue
        total += info.nbytes
    return total


def kv_bytes_per_token(config, ctx: int, k_type=K_TYPE, v_type=V_TYPE) -> int:
    """K and V bytes of `ctx` cached positions over every full-attention layer."""
    n_attn = sum(config.layer_type(i) == FULL_ATTENTION for i in range(config.num_hidden_layers))
    per_pos = config.num_key_value_heads * (row_bytes(k_type, config.head_dim)
                                            + row_bytes(v_type, config.head_dim))
    return n_attn * int(ctx) * per_pos


def state_bytes_per_token(config, state_bytes: int = STATE_BYTES) -> int:
    """Recurrent + conv state of every Gated DeltaNet layer."""
    n_gdn = sum(config.layer_type(i) == LINEAR_ATTENTION for i in range(config.num_hidden_layers))
    if not n_gdn:
        return 0
    c = config
    s = c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim
    channels = 2 * c.linear_num_key_heads * c.linear_key_head_dim + c.linear_num_value_heads * c.linear_value_head_dim
    conv = (c.linear_conv_kernel_dim - 1) * channels
    return n_gdn * (s + conv) * state_bytes


def decode_bytes(source, ctx: int, k_type=K_TYPE, v_type=V_TYPE,
                 state_bytes: int = STATE_BYTES) -> DecodeBytes:
    c = source.config
    return DecodeBytes(weight_bytes_per_token(source), kv_bytes_per_token(c, ctx, k_type, v_type),
                       state_bytes_per_token(c, state_bytes))


def roofline_tok_s(read_gb_s: float, nbytes: int) -> float:
    """Decode tokens/s if every step moved `nbytes` at `read_gb_s` (1e9 bytes/s)."""
    return read_gb_s * 1e9 / nbytes
