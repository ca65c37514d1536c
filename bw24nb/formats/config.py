"""ModelConfig: the architecture hyper-parameters every other module reads.

One dataclass for every supported family. Loaders fill it from GGUF metadata
(`<arch>.block_count`, ...) or from an HF `config.json`; nothing downstream looks at the
raw metadata again. Field names follow HF's config.json where one exists.
"""
from __future__ import annotations

from dataclasses import dataclass, field

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
    # Tokens
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    # Where it came from (for error messages)
    source: str = ""

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def n_rep(self) -> int:
        """Query heads per KV head (GQA ratio)."""
        return self.num_attention_heads // self.num_key_value_heads

    def is_moe_layer(self, layer: int) -> bool:
        return (self.num_experts > 0 and layer not in self.mlp_only_layers
                and (layer + 1) % max(self.decoder_sparse_step, 1) == 0)

    def layer_type(self, layer: int) -> str:
        return self.layer_types[layer] if self.layer_types else FULL_ATTENTION
