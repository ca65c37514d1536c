"""ModelConfig: the architecture hyper-parameters every other module reads.

One dataclass for every supported family. Loaders fill it from GGUF metadata
(`<arch>.block_count`, ...) or from an HF `config.json`; nothing downstream looks at the
raw metadata again. Field names follow HF's config.json where one exists.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import ModelFormatError

# Internal family names. GGUF arch names map onto these one to one; HF `model_type`s too.
FAMILIES = ("qwen2", "qwen3", "qwen3moe", "qwen3next", "qwen35", "qwen35moe")

HF_MODEL_TYPE_TO_FAMILY = {
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3moe",
    "qwen3_next": "qwen3next",
    "qwen3_5": "qwen35",
    "qwen3_5_text": "qwen35",
    "qwen3_5_moe": "qwen35moe",
    "qwen3_5_moe_text": "qwen35moe",
}

GGUF_ARCH_TO_FAMILY = {
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen3moe": "qwen3moe",
    "qwen3next": "qwen3next",
    "qwen35": "qwen35",
    "qwen35moe": "qwen35moe",
}

FULL_ATTENTION = "full_attention"
LINEAR_ATTENTION = "linear_attention"

# Families whose layers mix Gated DeltaNet and full attention (and may carry an MTP head).
HYBRID_FAMILIES = ("qwen3next", "qwen35", "qwen35moe")
MOE_FAMILIES = ("qwen3moe", "qwen3next", "qwen35moe")
# Dense MLP in every layer (so `intermediate_size` is required).
DENSE_FAMILIES = ("qwen2", "qwen3", "qwen35")

# A layer count beyond this is a corrupted file, not a model (the largest Qwen has 94 layers);
# checking it keeps a flipped bit from turning into a multi-gigabyte `layer_types` list.
MAX_LAYERS = 4096
# Any size beyond this is corruption too, and would overflow the int32 index math of kernels.
MAX_DIM = 1 << 31


@dataclass
class ModelConfig:
    family: str                       # one of FAMILIES
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int            # dense MLP width (0 when every layer is MoE)
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    partial_rotary_factor: float = 1.0   # rotary_dim = int(head_dim * partial_rotary_factor)
    attention_bias: bool = False         # Qwen2: q/k/v projections carry a bias
    qk_norm: bool = False                # Qwen3 and later: per-head RMSNorm on q and k
    attn_output_gate: bool = False       # Qwen3-Next/3.5: q_proj also yields a sigmoid gate
    # Per layer: FULL_ATTENTION or LINEAR_ATTENTION (Gated DeltaNet). Dense Qwen2/3: all full.
    layer_types: list[str] = field(default_factory=list)
    # Gated DeltaNet (linear attention) shapes
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    # Mixture of experts
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = True
    mlp_only_layers: list[int] = field(default_factory=list)   # layers with a dense MLP in a MoE model
    decoder_sparse_step: int = 1
    # Multi-token prediction head (Qwen3.5/3.6: mtp_num_hidden_layers; GGUF: nextn_predict_layers)
    mtp_num_hidden_layers: int = 0
    # RoPE scaling beyond plain RoPE, normalised to HF's keys: {} for plain RoPE, else e.g.
    # {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}.
    rope_scaling: dict = field(default_factory=dict)
    # Tokens
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    # Every id that ends generation (HF: the config's eos list; GGUF: eos, eot, eom), eos first.
    eos_token_ids: list[int] = field(default_factory=list)
    # Where it came from (for error messages)
    source: str = ""

    @property
    def rotary_dim(self) -> int:
        # HF truncates (int(head_dim * factor)); the epsilon keeps a factor read back as
        # rope_dims / head_dim from landing a hair under rope_dims (48 * (20/48) < 20).
        return int(self.head_dim * self.partial_rotary_factor + 1e-9)

    @property
    def n_rep(self) -> int:
        """Query heads per KV head (GQA ratio)."""
        return self.num_attention_heads // self.num_key_value_heads

    def is_moe_layer(self, layer: int) -> bool:
        return (self.num_experts > 0 and layer not in self.mlp_only_layers
                and (layer + 1) % max(self.decoder_sparse_step, 1) == 0)

    def layer_type(self, layer: int) -> str:
        return self.layer_types[layer] if self.layer_types else FULL_ATTENTION


def layer_types_from_interval(num_layers: int, interval: int) -> list[str]:
    """Hybrid layer pattern: layer i is full attention iff (i + 1) % interval == 0
    (HF's `full_attention_interval`, llama.cpp's `<arch>.full_attention_interval`)."""
    return [FULL_ATTENTION if (i + 1) % interval == 0 else LINEAR_ATTENTION
            for i in range(num_layers)]


def interval_from_layer_types(layer_types: list[str]) -> int | None:
    """The `full_attention_interval` that reproduces `layer_types`, or None if no interval does."""
    n = len(layer_types)
    for interval in range(1, n + 2):
        if layer_types_from_interval(n, interval) == list(layer_types):
            return interval
    return None


def validate_config(cfg: ModelConfig, path) -> ModelConfig:
    """Cross-field sanity checks shared by every loader; ModelFormatError naming `path` and the
    field on the first violation. Catches corrupted metadata before it becomes a shape error
    (or a division by zero) deep inside a model."""
    def bad(problem: str):
        raise ModelFormatError(path, f"model config: {problem}")

    positive = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "max_position_embeddings"]
    for name in positive + ["intermediate_size", "moe_intermediate_size", "num_experts",
                            "shared_expert_intermediate_size", "linear_num_key_heads",
                            "linear_num_value_heads", "linear_key_head_dim",
                            "linear_value_head_dim", "linear_conv_kernel_dim"]:
        v = getattr(cfg, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < (1 if name in positive else 0):
            bad(f"{name} must be a {'positive' if name in positive else 'non-negative'} integer, "
                f"got {v!r}")
        if v >= MAX_DIM:
            bad(f"{name} = {v} is implausible (>= {MAX_DIM})")
    if cfg.num_hidden_layers > MAX_LAYERS:
        bad(f"num_hidden_layers = {cfg.num_hidden_layers} is implausible (> {MAX_LAYERS})")
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        bad(f"num_attention_heads ({cfg.num_attention_heads}) is not a multiple of "
            f"num_key_value_heads ({cfg.num_key_value_heads})")
    for name in ("rms_norm_eps", "rope_theta"):
        v = getattr(cfg, name)
        if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            bad(f"{name} must be a positive finite number, got {v!r}")
    if not (0.0 < cfg.partial_rotary_factor <= 1.0):
        bad(f"partial_rotary_factor must be in (0, 1], got {cfg.partial_rotary_factor!r}")
    if cfg.rotary_dim % 2:
        bad(f"rotary dimension {cfg.rotary_dim} (head_dim {cfg.head_dim} x partial_rotary_factor "
            f"{cfg.partial_rotary_factor}) must be even")
    if cfg.family in DENSE_FAMILIES and cfg.intermediate_size <= 0:
        bad(f"intermediate_size must be positive for {cfg.family}, got {cfg.intermediate_size}")
    if len(cfg.layer_types) != cfg.num_hidden_layers:
        bad(f"layer_types has {len(cfg.layer_types)} entries for {cfg.num_hidden_layers} layers")
    kinds = {FULL_ATTENTION} | ({LINEAR_ATTENTION} if cfg.family in HYBRID_FAMILIES else set())
    odd = sorted(set(cfg.layer_types) - kinds)
    if odd:
        bad(f"layer_types holds {odd}; {cfg.family} layers are {sorted(kinds)}")
    if cfg.family in HYBRID_FAMILIES:
        for name in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                     "linear_value_head_dim", "linear_conv_kernel_dim"):
            v = getattr(cfg, name)
            if not isinstance(v, int) or v <= 0:
                bad(f"{name} must be a positive integer for {cfg.family}, got {v!r}")
        if cfg.linear_num_value_heads % cfg.linear_num_key_heads:
            bad(f"linear_num_value_heads ({cfg.linear_num_value_heads}) is not a multiple of "
                f"linear_num_key_heads ({cfg.linear_num_key_heads})")
    if cfg.family in MOE_FAMILIES:
        if cfg.num_experts <= 0 or cfg.moe_intermediate_size <= 0:
            bad(f"{cfg.family} needs num_experts and moe_intermediate_size > 0, got "
                f"{cfg.num_experts} and {cfg.moe_intermediate_size}")
        if not (0 < cfg.num_experts_per_tok <= cfg.num_experts):
            bad(f"num_experts_per_tok must be in 1..num_experts ({cfg.num_experts}), got "
                f"{cfg.num_experts_per_tok}")
        if cfg.decoder_sparse_step <= 0:
            bad(f"decoder_sparse_step must be positive, got {cfg.decoder_sparse_step}")
    if cfg.mtp_num_hidden_layers < 0:
        bad(f"mtp_num_hidden_layers must be >= 0, got {cfg.mtp_num_hidden_layers}")
    for name in ("bos_token_id", "eos_token_id"):
        v = getattr(cfg, name)
        if v is not None and not (0 <= v):
            bad(f"{name} must be a non-negative token id, got {v}")
    if any(not isinstance(v, int) or v < 0 for v in cfg.eos_token_ids):
        bad(f"eos_token_ids must be non-negative token ids, got {cfg.eos_token_ids}")
    return cfg
