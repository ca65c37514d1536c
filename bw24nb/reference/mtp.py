"""Multi-token prediction (MTP / NextN) head of Qwen3.5 / Qwen3.6 — the numpy reference.

transformers has no MTP module (it drops the checkpoint's `mtp.*` tensors), so the recipe comes
from the two runtimes that execute it, which agree: vLLM's `Qwen3_5MultiTokenPredictor`
(qwen3_5_mtp.py, same as `Qwen3NextMultiTokenPredictor`) and llama.cpp's qwen35 /
qwen35moe `graph_mtp`. For the main model's final hidden state at position p and the token
chosen for position p+1:

    h = rms_norm(hidden_p) * output_norm            the main model's normed output (vLLM's
                                                    `hidden_states`, llama.cpp's `h_nextn`)
    e = token_embd[next_token]                      (nextn.embed_tokens when present)
    x = eh_proj @ concat(rms_norm(e) * enorm,       ORDER: embedding first, hidden second
                         rms_norm(h) * hnorm)       (vLLM `torch.cat([inputs_embeds, hidden])`,
                                                     llama.cpp `ggml_concat(e_norm, h_norm)`)
    y = decoder_layer(x)                            one full-attention block (blk.{n_layers}),
                                                    with its own KV cache; rope position p
    logits = output @ (rms_norm(y) * shared_head_norm)   (nextn.shared_head_head when present,
                                                          else the main LM head)

The decoder layer is the main stack's `Layer` class (reference/model.py) built on block
`num_hidden_layers`, not a re-implementation: the MTP block is a full-attention decoder layer
of the same family (MoE FFN in Qwen3.5-MoE, dense in Qwen3.5).

Sequence semantics: the head is itself a one-layer causal model over the pairs
`(hidden_t, token_{t+1})`, t = 0, 1, ...; its KV cache position t holds pair t, so RoPE sees the
hidden state's position. A caller keeps it in step with the main model by feeding every accepted
pair (`forward` for a prompt's worth at once, `draft` for one); `truncate` drops rejected ones.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import MissingTensor
from ..formats.config import FULL_ATTENTION
from ..models.weights import Weights
from .ops import F32, linear, rms_norm


class MTPHead:
    """MTP block `index` (usually the only one) of a Qwen3.5/3.6 checkpoint, with its KV cache.

    `forward(hidden[T, H], next_tokens[T]) -> logits[T, V]` appends T pairs;
    `draft(hidden[H], next_token) -> logits[V]` appends one. `hidden` is the main model's
    final hidden state *before* its output norm (`ReferenceModel.last_hidden` /
    `hidden_states`); the head applies `output_norm` itself.
    """

    def __init__(self, config, weights, index: int = 0):
        from .model import Layer   # the main stack's layer recipe, reused as is

        if not isinstance(weights, Weights):
            weights = Weights(weights)
        if not 0 <= index < max(config.mtp_num_hidden_layers, 1):
            raise ValueError(f"MTP block {index} does not exist (mtp_num_hidden_layers="
                             f"{config.mtp_num_hidden_layers})")
        self.block = b = config.num_hidden_layers + index
        if f"blk.{b}.nextn.eh_proj.weight" not in weights:
            raise MissingTensor(weights.source or "<weights>",
                                f"no MTP head: blk.{b}.nextn.eh_proj.weight is missing (the "
                                f"checkpoint was converted without its mtp.* tensors)")
        self.eps = config.rms_norm_eps
        # The MTP block is a full-attention layer at index `b`, past the main stack's layer_types.
        n_extra = b + 1 - len(config.layer_types)
        mtp_config = dataclasses.replace(
            config, layer_types=list(config.layer_types) + [FULL_ATTENTION] * max(n_extra, 0))
        self.layer = Layer(mtp_config, weights, b)

        self.output_norm = weights.require("output_norm.weight")
        self.eh_proj = weights.blk(b, "nextn.eh_proj.weight")              # [H, 2H]
        self.enorm = weights.blk(b, "nextn.enorm.weight")
        self.hnorm = weights.blk(b, "nextn.hnorm.weight")
        head_norm = weights.blk_opt(b, "nextn.shared_head_norm.weight")
        self.head_norm = head_norm if head_norm is not None else self.output_norm
        embed = weights.blk_opt(b, "nextn.embed_tokens.weight")
        self.embed = embed if embed is not None else weights.require("token_embd.weight")
        head = weights.blk_opt(b, "nextn.shared_head_head.weight")
        if head is None:
            head = weights.get("output.weight")
        self.head = head if head is not None else weights.require("token_embd.weight")   # tied
        H = config.hidden_size
        if self.eh_proj.shape != (H, 2 * H):
            raise MissingTensor(weights.source or "<weights>",
                                f"blk.{b}.nextn.eh_proj.weight has shape {self.eh_proj.shape}, "
                                f"expected ({H}, {2 * H})")

    def reset(self) -> None:
        """Empty the MTP layer's KV cache."""
        self.layer.mixer.reset()

    @property
    def position(self) -> int:
        """Pairs seen so far = the rope position of the next pair."""
        return self.layer.mixer.position

    def truncate(self, length: int) -> None:
        """Keep only the first `length` pairs (drop drafts the main model rejected)."""
        self.layer.mixer.cache.truncate(length)

    def forward(self, hidden: np.ndarray, next_tokens) -> np.ndarray:
        """`hidden[T, H]` (main model, before output norm) + `next_tokens[T]` -> logits `[T, V]`."""
        hidden = np.atleast_2d(np.asarray(hidden, dtype=F32))
        next_tokens = np.asarray(next_tokens, dtype=np.int64).reshape(-1)
        if next_tokens.shape[0] != hidden.shape[0]:
            raise ValueError(f"{hidden.shape[0]} hidden states but {next_tokens.shape[0]} tokens")
        h = rms_norm(hidden, self.output_norm, self.eps)                   # h_nextn
        e = self.embed[next_tokens].astype(F32)
        x = np.concatenate([rms_norm(e, self.enorm, self.eps), rms_norm(h, self.hnorm, self.eps)], -1)
        x = linear(x, self.eh_proj)
        y = self.layer.forward(x, step=x.shape[0] == 1)
        return linear(rms_norm(y, self.head_norm, self.eps), self.head)

    def draft(self, hidden: np.ndarray, next_token: int) -> np.ndarray:
        """One pair -> draft logits `[V]` for the token after `next_token`."""
        return self.forward(np.asarray(hidden, dtype=F32)[None, :], [int(next_token)])[0]


def mtp_draft(model, hidden: np.ndarray, next_token: int) -> np.ndarray:
    """`model.mtp_draft(hidden, next_token)`: draft logits `[V]` from the model's MTP head
    (created on first use and reset with the model)."""
    return model.mtp_draft(hidden, next_token)


__all__ = ["MTPHead", "mtp_draft"]
