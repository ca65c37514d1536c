"""ReferenceModel: a whole Qwen-family decoder in numpy — the oracle the engine is gated on.

One recipe covers every family (transformers `Qwen2DecoderLayer`, `Qwen3DecoderLayer`,
`Qwen3MoeDecoderLayer`, `Qwen3NextDecoderLayer`, `Qwen3_5DecoderLayer`):

    h = token_embd[tokens]
    for each layer:
        h = h + mixer(rms_norm(h, attn_norm))            # full attention or Gated DeltaNet
        h = h + mlp(rms_norm(h, ffn_norm))               # dense SwiGLU or sparse MoE
    logits = output @ rms_norm(h, output_norm)

Mixers are stateful (KV cache / conv + recurrent state) and calls append: `prefill(a)` then
`prefill(b)` equals `prefill(a + b)`; `decode(t)` is a one-token prefill. `reset()` starts a
new sequence.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..formats.config import LINEAR_ATTENTION
from .attention import FullAttention
from .moe import moe_forward
from .ops import F32, linear, rms_norm, swiglu


class DenseMLP:
    """SwiGLU MLP `down @ (silu(gate @ x) * (up @ x))` (`Qwen2MLP.forward`)."""

    def __init__(self, weights, layer: int):
        self.gate = weights.blk(layer, "ffn_gate.weight")
        self.up = weights.blk(layer, "ffn_up.weight")
        self.down = weights.blk(layer, "ffn_down.weight")

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return linear(swiglu(linear(x, self.gate), linear(x, self.up)), self.down)


class SparseMoE:
    """Router + stacked experts (+ gated shared expert) (`Qwen3MoeSparseMoeBlock`,
    `Qwen3_5MoeSparseMoeBlock`); the math is `reference.moe.moe_forward`."""

    def __init__(self, config, weights, layer: int):
        self.top_k = config.num_experts_per_tok
        self.norm_topk_prob = config.norm_topk_prob
        self.router = weights.blk(layer, "ffn_gate_inp.weight")
        self.experts = (weights.blk(layer, "ffn_gate_exps.weight"),
                        weights.blk(layer, "ffn_up_exps.weight"),
                        weights.blk(layer, "ffn_down_exps.weight"))
        self.shared = None
        self.shared_gate = None
        if weights.blk_opt(layer, "ffn_gate_shexp.weight") is not None:
            self.shared = (weights.blk(layer, "ffn_gate_shexp.weight"),
                           weights.blk(layer, "ffn_up_shexp.weight"),
                           weights.blk(layer, "ffn_down_shexp.weight"))
            self.shared_gate = weights.blk_opt(layer, "ffn_gate_inp_shexp.weight")

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return moe_forward(x, self.router, self.experts, self.top_k, self.norm_topk_prob,
                           shared=self.shared, shared_gate_w=self.shared_gate)


class Layer:
    """One decoder block: pre-norm mixer + residual, pre-norm MLP + residual."""

    def __init__(self, config, weights, layer: int):
        self.eps = config.rms_norm_eps
        self.attn_norm = weights.blk(layer, "attn_norm.weight")
        # llama.cpp names the post-attention norm `ffn_norm` for Qwen2/3 and
        # `post_attention_norm` for Qwen3-Next/3.5; accept either.
        post = weights.blk_opt(layer, "ffn_norm.weight")
        self.ffn_norm = post if post is not None else weights.blk(layer, "post_attention_norm.weight")
        if config.layer_type(layer) == LINEAR_ATTENTION:
            from .gated_deltanet import GatedDeltaNet
            self.mixer = GatedDeltaNet(config, weights, layer)
        else:
            self.mixer = FullAttention(config, weights, layer)
        self.mlp = SparseMoE(config, weights, layer) if config.is_moe_layer(layer) \
            else DenseMLP(weights, layer)

    def forward(self, h: np.ndarray, step: bool = False) -> np.ndarray:
        """`h[T, H]` -> `[T, H]`, advancing the mixer's state by T positions. `step` (T == 1)
        takes the mixer's decode path (Gated DeltaNet: recurrent rather than chunked form), so
        prefill-vs-decode agreement checks two different algorithms."""
        x = rms_norm(h, self.attn_norm, self.eps)
        mixed = self.mixer.decode(x[0])[None, :] if step else self.mixer.prefill(x)
        h = h + mixed
        return h + self.mlp(rms_norm(h, self.ffn_norm, self.eps))


class ReferenceModel:
    """numpy reference of a whole model: `prefill(tokens) -> logits[T, V]`,
    `decode(token) -> logits[V]`, `reset()`, `last_hidden`, `mtp_draft(hidden, next_token)`."""

    def __init__(self, config, weights):
        self.config = config
        self.weights = weights
        self.eps = config.rms_norm_eps
        self.token_embd = weights.require("token_embd.weight")
        self.output_norm = weights.require("output_norm.weight")
        self.output = weights.get("output.weight")
        if self.output is None:          # tied LM head
            self.output = self.token_embd
        self.layers = [Layer(config, weights, i) for i in range(config.num_hidden_layers)]
        self.last_hidden: np.ndarray | None = None   # [H], before output_norm, last position
        self.position = 0
        self._mtp = None
        # snapshot bookkeeping: positions the stack was rewound to since the last reset
        self._sequence = 0
        self._rewinds: list[int] = []

    def reset(self) -> None:
        """Forget the sequence: empty KV caches, zero recurrent/conv state, position 0."""
        for layer in self.layers:
            layer.mixer.reset()
        if self._mtp is not None and hasattr(self._mtp, "reset"):
            self._mtp.reset()
        self.last_hidden = None
        self.position = 0
        self._sequence += 1
        self._rewinds = []

    def hidden_states(self, tokens, step: bool = False) -> np.ndarray:
        """Run the decoder stack on `tokens` (appending to the state): final hidden states
        `[T, H]` before the output norm. `step`: one token through the mixers' decode path."""
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if tokens.size == 0:
            raise ValueError("prefill needs at least one token")
        if tokens.min() < 0 or tokens.max() >= self.token_embd.shape[0]:
            raise ValueError(f"token ids must lie in [0, {self.token_embd.shape[0]})")
        h = self.token_embd[tokens].astype(F32)
        for layer in self.layers:
            h = layer.forward(h, step=step)
        self.position += tokens.size
        self.last_hidden = h[-1].copy()
        return h

    def logits(self, h: np.ndarray) -> np.ndarray:
        """LM head on hidden states `[..., H]` -> `[..., V]`."""
        return linear(rms_norm(h, self.output_norm, self.eps), self.output)

    def prefill(self, tokens) -> np.ndarray:
        """Logits `[T, V]` (float32) for every position of `tokens`, continuing the sequence."""
        return self.logits(self.hidden_states(tokens))

    def decode(self, token: int) -> np.ndarray:
        """Logits `[V]` for one more token."""
        return self.logits(self.hidden_states([int(token)], step=True))[0]

    def mtp_draft(self, hidden: np.ndarray, next_token: int) -> np.ndarray:
        """Multi-token-prediction draft logits `[V]` from the main model's `hidden` (its
        `last_hidden` at position p) and the token sampled at p+1 (Qwen3.5/3.6 MTP head;
        bw24nb.reference.mtp)."""
        if not self.config.mtp_num_hidden_layers:
            raise ValueError(f"family {self.config.family!r} checkpoint has no MTP head")
        if self._mtp is None:
            from .mtp import MTPHead
            self._mtp = MTPHead(self.config, self.weights)
        return self._mtp.draft(hidden, next_token)

    # ------------------------------------------------------------------ speculative decoding
    # Additive helpers for bw24nb/spec.py: state snapshots (rollback) and the MTP head with its
    # own output hidden state (chained drafting). Nothing above depends on them.

    def snapshot(self) -> "ModelSnapshot":
        """The sequence state now, for `restore`: copies of every Gated DeltaNet conv window and
        recurrent state (small, fixed size), the KV caches' lengths (positions below a length
        are never rewritten, so the length is enough), position, last_hidden, MTP length."""
        mixers = []
        for layer in self.layers:
            m = layer.mixer
            if hasattr(m, "ssm_state"):
                mixers.append((m.conv_state.copy(), m.ssm_state.copy()))
            else:
                mixers.append(m.cache.length)
        return ModelSnapshot(
            sequence=self._sequence, n_rewinds=len(self._rewinds), position=self.position,
            last_hidden=None if self.last_hidden is None else self.last_hidden.copy(),
            mixers=mixers, mtp_length=None if self._mtp is None else self._mtp.position)

    def restore(self, snap: "ModelSnapshot") -> None:
        """Return to `snap`'s state: KV caches truncate, recurrent/conv states are copied back.

        Valid while nothing the snapshot relies on was overwritten: same sequence (no reset
        since), and no rewind since it below its position (the KV rows it keeps were then
        recomputed, perhaps from other tokens). The MTP head, if the snapshot saw it, is
        truncated back to its length then (it must not have been truncated below it)."""
        if snap.sequence != self._sequence:
            raise ValueError("snapshot is from an earlier sequence (the model was reset since)")
        if snap.position > self.position or \
                any(p < snap.position for p in self._rewinds[snap.n_rewinds:]):
            raise ValueError(f"snapshot at position {snap.position} is stale: the sequence was "
                             f"rewound below it since it was taken")
        if snap.mtp_length is not None and self._mtp is not None \
                and self._mtp.position < snap.mtp_length:
            raise ValueError(f"snapshot's MTP length {snap.mtp_length} > the head's "
                             f"{self._mtp.position}: the head was truncated since")
        for layer, saved in zip(self.layers, snap.mixers):
            m = layer.mixer
            if isinstance(saved, tuple):
                m.conv_state, m.ssm_state = saved[0].copy(), saved[1].copy()
            else:
                m.cache.truncate(saved)
        if snap.mtp_length is not None and self._mtp is not None:
            self._mtp.truncate(snap.mtp_length)
        if snap.position < self.position:
            self._rewinds.append(snap.position)
        self.position = snap.position
        self.last_hidden = None if snap.last_hidden is None else snap.last_hidden.copy()

    @property
    def mtp(self):
        """The MTP head (`reference.mtp.MTPHead`), built on first use, reset with the model."""
        if not self.config.mtp_num_hidden_layers:
            raise ValueError(f"family {self.config.family!r} checkpoint has no MTP head")
        if self._mtp is None:
            from .mtp import MTPHead
            self._mtp = MTPHead(self.config, self.weights)
        return self._mtp

    def normed_hidden(self, h: np.ndarray) -> np.ndarray:
        """`rms_norm(h) * output_norm`: the LM head's input, and what the MTP head consumes
        (`logits(h) == linear(normed_hidden(h), output)` bit for bit)."""
        return rms_norm(h, self.output_norm, self.eps)

    def mtp_forward(self, normed, next_tokens, vocab=None) -> tuple[np.ndarray, np.ndarray]:
        """The MTP head on already-normed hidden states (`normed_hidden` of the main model, or
        the head's own previous output): appends T pairs, returns `(logits[T, V or len(vocab)],
        out[T, H])` where `out = rms_norm(y) * shared_head_norm` is the head's normed output —
        what the next chained draft step consumes in place of the main model's hidden (vLLM's
        MTP proposer chains the same way). `vocab`: only these LM-head rows (FR-Spec trim).

        `mtp_forward(normed_hidden(h), t)[0]` equals `MTPHead.forward(h, t)` bit for bit (the
        same operations, the output norm applied once outside instead of inside)."""
        head = self.mtp
        h = np.atleast_2d(np.asarray(normed, dtype=F32))
        next_tokens = np.asarray(next_tokens, dtype=np.int64).reshape(-1)
        if next_tokens.shape[0] != h.shape[0]:
            raise ValueError(f"{h.shape[0]} hidden states but {next_tokens.shape[0]} tokens")
        e = head.embed[next_tokens].astype(F32)
        x = np.concatenate([rms_norm(e, head.enorm, head.eps), rms_norm(h, head.hnorm, head.eps)], -1)
        x = linear(x, head.eh_proj)
        y = head.layer.forward(x, step=x.shape[0] == 1)
        out = rms_norm(y, head.head_norm, head.eps)
        W = head.head if vocab is None else head.head[np.asarray(vocab, dtype=np.int64)]
        return linear(out, W), out


@dataclass
class ModelSnapshot:
    """`ReferenceModel.snapshot()`: enough to return to a point of the current sequence."""
    sequence: int                 # ReferenceModel reset count when taken
    n_rewinds: int                # rewinds recorded when taken (later ones may invalidate it)
    position: int
    last_hidden: np.ndarray | None
    mixers: list                  # per layer: KV length (attention) | (conv_state, ssm_state)
    mtp_length: int | None
