"""Weights: a checkpoint's tensors as float32 numpy arrays under internal (llama.cpp) names.

Internal names are llama.cpp's GGUF tensor names (`token_embd.weight`,
`blk.3.attn_q.weight`, `blk.3.ffn_down_exps.weight`, `output.weight`, ...); shapes are numpy
order (a linear weight is `[out, in]`, stacked experts `[E, out, in]`).

- GGUF: names pass through; every tensor is dequantized to float32.
- HF safetensors: each family module supplies `HF_NAME_RULES` (regex -> internal template)
  and optionally `convert_hf(weights, config, source)` for what llama.cpp's
  convert_hf_to_gguf.py does beyond renaming (stacking experts, `1 + w` norms, ...), so both
  formats yield identical internal tensors.

Loader quirks live here and in the family modules, never in the forward pass.
"""
from __future__ import annotations

import re
from typing import Iterable

import numpy as np

from ..errors import MissingTensor, ModelFormatError


class Weights(dict):
    """`{internal name: float32 ndarray}` plus a few lookups that fail with typed errors."""

    def __init__(self, *args, source: str = "", **kwargs):
        super().__init__(*args, **kwargs)
        self.source = source

    def require(self, name: str) -> np.ndarray:
        """The tensor `name`, or `MissingTensor` saying which checkpoint lacks it."""
        try:
            return self[name]
        except KeyError:
            raise MissingTensor(self.source or "<weights>",
                                f"tensor {name!r} is missing; the checkpoint is incomplete or not "
                                f"of the family its config claims") from None

    def blk(self, layer: int, suffix: str) -> np.ndarray:
        """`blk.{layer}.{suffix}`, required (e.g. `w.blk(0, "attn_q.weight")`)."""
        return self.require(f"blk.{layer}.{suffix}")

    def blk_opt(self, layer: int, suffix: str) -> np.ndarray | None:
        """`blk.{layer}.{suffix}` or None when the checkpoint has no such tensor."""
        return self.get(f"blk.{layer}.{suffix}")


# HF -> internal rules shared by every Qwen family. Order matters only where two patterns could
# both match, which none of these do. `{L}` in a template is the layer index.
QWEN_HF_NAME_RULES: list[tuple[str, str]] = [
    (r"model\.embed_tokens\.weight", "token_embd.weight"),
    (r"model\.norm\.weight", "output_norm.weight"),
    (r"lm_head\.weight", "output.weight"),
    (r"model\.layers\.(\d+)\.input_layernorm\.weight", "blk.{L}.attn_norm.weight"),
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.weight", "blk.{L}.ffn_norm.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.q_proj\.(weight|bias)", "blk.{L}.attn_q.{1}"),
    (r"model\.layers\.(\d+)\.self_attn\.k_proj\.(weight|bias)", "blk.{L}.attn_k.{1}"),
    (r"model\.layers\.(\d+)\.self_attn\.v_proj\.(weight|bias)", "blk.{L}.attn_v.{1}"),
    (r"model\.layers\.(\d+)\.self_attn\.o_proj\.(weight|bias)", "blk.{L}.attn_output.{1}"),
    (r"model\.layers\.(\d+)\.self_attn\.q_norm\.weight", "blk.{L}.attn_q_norm.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.k_norm\.weight", "blk.{L}.attn_k_norm.weight"),
    (r"model\.layers\.(\d+)\.mlp\.gate_proj\.weight", "blk.{L}.ffn_gate.weight"),
    (r"model\.layers\.(\d+)\.mlp\.up_proj\.weight", "blk.{L}.ffn_up.weight"),
    (r"model\.layers\.(\d+)\.mlp\.down_proj\.weight", "blk.{L}.ffn_down.weight"),
    # MoE: router, shared expert and its gate
    (r"model\.layers\.(\d+)\.mlp\.gate\.weight", "blk.{L}.ffn_gate_inp.weight"),
    (r"model\.layers\.(\d+)\.mlp\.shared_expert\.gate_proj\.weight", "blk.{L}.ffn_gate_shexp.weight"),
    (r"model\.layers\.(\d+)\.mlp\.shared_expert\.up_proj\.weight", "blk.{L}.ffn_up_shexp.weight"),
    (r"model\.layers\.(\d+)\.mlp\.shared_expert\.down_proj\.weight", "blk.{L}.ffn_down_shexp.weight"),
    (r"model\.layers\.(\d+)\.mlp\.shared_expert_gate\.weight", "blk.{L}.ffn_gate_inp_shexp.weight"),
    # MoE experts, per-expert checkpoint layout (what HF checkpoints and save_pretrained hold):
    # collected as `blk.{L}.ffn_gate_exps.weight#{E}` then stacked by `stack_experts`.
    (r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.gate_proj\.weight", "blk.{L}.ffn_gate_exps.weight#{1}"),
    (r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.up_proj\.weight", "blk.{L}.ffn_up_exps.weight#{1}"),
    (r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.down_proj\.weight", "blk.{L}.ffn_down_exps.weight#{1}"),
    # MoE experts, fused layout (transformers >= 5 in memory; some checkpoints store it):
    # gate_up_proj[E, 2I, H] = concat(gate, up) along dim 1; split by `split_fused_experts`.
    (r"model\.layers\.(\d+)\.mlp\.experts\.gate_up_proj", "blk.{L}.ffn_gate_up_exps.weight"),
    (r"model\.layers\.(\d+)\.mlp\.experts\.down_proj", "blk.{L}.ffn_down_exps.weight"),
]


def compile_rules(rules: Iterable[tuple[str, str]]) -> list[tuple[re.Pattern, str]]:
    return [(re.compile(pat + r"\Z"), tmpl) for pat, tmpl in rules]


def map_name(name: str, rules: list[tuple[re.Pattern, str]]) -> str | None:
    """Internal name for HF tensor `name`, or None when no rule matches.

    A template's `{L}` is the first group (layer), `{1}`, `{2}`... are groups 2, 3, ...
    """
    for pat, tmpl in rules:
        m = pat.match(name)
        if m:
            groups = m.groups()
            out = tmpl
            if groups:
                out = out.replace("{L}", groups[0])
                for i, g in enumerate(groups[1:], start=1):
                    out = out.replace("{%d}" % i, g)
            return out
    return None


def map_hf_tensors(source, rules: Iterable[tuple[str, str]],
                   ignore: Iterable[str] = ()) -> Weights:
    """Dequantize every tensor of an HF `source` and rename it with `rules`.

    Names matching a regex in `ignore` are skipped (vision towers, MTP heads handled elsewhere);
    any other unmatched name is an error, so a family never silently drops a tensor it needs.
    """
    compiled = compile_rules(rules)
    ignored = [re.compile(p) for p in ignore]
    w = Weights(source=str(getattr(source, "path", "")))
    for name in source.names():
        internal = map_name(name, compiled)
        if internal is None:
            if any(p.match(name) for p in ignored):
                continue
            raise ModelFormatError(getattr(source, "path", "<source>"),
                                   f"tensor {name!r} has no internal name for family "
                                   f"{source.config.family!r}; add a rule to its HF_NAME_RULES "
                                   f"or to its ignore list")
        w[internal] = np.ascontiguousarray(source.dequantize(name), dtype=np.float32)
    return w


def stack_experts(w: Weights) -> Weights:
    """Stack per-expert tensors `name#e` into `name[E, out, in]` (llama.cpp's `*_exps`),
    as `Qwen2MoeModel.modify_tensors` in convert_hf_to_gguf.py does."""
    groups: dict[str, dict[int, np.ndarray]] = {}
    for key in [k for k in w if "#" in k]:
        base, e = key.rsplit("#", 1)
        groups.setdefault(base, {})[int(e)] = w.pop(key)
    for base, by_e in groups.items():
        n = max(by_e) + 1
        if sorted(by_e) != list(range(n)):
            raise MissingTensor(w.source, f"{base}: experts {sorted(set(range(n)) - set(by_e))} missing")
        w[base] = np.stack([by_e[e] for e in range(n)], axis=0)
    return w


def split_fused_experts(w: Weights) -> Weights:
    """`ffn_gate_up_exps[E, 2I, H]` -> `ffn_gate_exps[E, I, H]` + `ffn_up_exps[E, I, H]`
    (transformers' `gate, up = linear(x, gate_up_proj[e]).chunk(2, dim=-1)`)."""
    for key in [k for k in w if k.endswith("ffn_gate_up_exps.weight")]:
        fused = w.pop(key)
        half = fused.shape[1] // 2
        w[key.replace("gate_up_exps", "gate_exps")] = np.ascontiguousarray(fused[:, :half])
        w[key.replace("gate_up_exps", "up_exps")] = np.ascontiguousarray(fused[:, half:])
    return w


def gguf_tensors(source) -> Weights:
    """Every tensor of a GGUF `source`, dequantized; names are already internal."""
    w = Weights(source=str(getattr(source, "path", "")))
    for name in source.names():
        w[name] = np.ascontiguousarray(source.dequantize(name), dtype=np.float32)
    return w


def tie_output(w: Weights) -> Weights:
    """No `output.weight` means the LM head is the embedding (tied; llama.cpp omits it too)."""
    if "output.weight" not in w and "token_embd.weight" in w:
        w["output.weight"] = w["token_embd.weight"]
    return w


def check_names(w: Weights, names: Iterable[str]) -> Weights:
    """Raise `MissingTensor` for the first needed name the weights lack."""
    for n in names:
        w.require(n)
    return w


def load_weights(source) -> Weights:
    """`TensorSource` -> `Weights` (float32, internal names), for any registered family.

    The family module (see `bw24nb.models.FAMILY_MODULES`) provides `HF_NAME_RULES`, optional
    `HF_IGNORE`, optional `convert_hf(w, config, source) -> Weights`, optional
    `convert_gguf(w, config, source) -> Weights`, and `tensor_names(config)` (what it needs).
    """
    from . import family_module

    config = source.config
    module = family_module(config.family)
    if source.format == "gguf":
        w = gguf_tensors(source)
        if hasattr(module, "convert_gguf"):
            w = module.convert_gguf(w, config, source)
    else:
        w = map_hf_tensors(source, module.HF_NAME_RULES, getattr(module, "HF_IGNORE", ()))
        w = split_fused_experts(stack_experts(w))
        if hasattr(module, "convert_hf"):
            w = module.convert_hf(w, config, source)
    w = tie_output(w)
    return check_names(w, module.tensor_names(config))
