"""Speculative decoding with the MTP head: draft K tokens, verify them in one target forward.

One round, with the target at position P (tokens t_0..t_{P-1} consumed, hidden h_{P-1} known)
and the next token x = t_P already chosen but not yet consumed:

    draft    the MTP head proposes d_1..d_K autoregressively: d_1 from (h_{P-1}, x), then
             d_{i+1} from (its own output hidden, d_i)                            [K small calls]
    verify   one target forward over [x, d_1, .., d_K] (the prefill path at M = K+1): logits
             and hidden states at positions P..P+K                                 [1 call]
    accept   greedy: the longest prefix with d_i == argmax(logits[i-1]), then the target's own
             token argmax(logits[a]) -- a+1 new tokens per round, always at least one.
             sampling: the speculative-sampling rule (Leviathan et al. 2023, Chen et al. 2023):
             accept d_i with probability min(1, p(d_i) / q(d_i)); at the first rejection draw
             from norm(max(0, p - q)); if all K pass, draw the bonus token from p. The output
             distribution is then exactly the target's (p: the target's distribution after
             temperature / top-k / top-p, as `sampling.py` defines it; q: the draft's).
    rollback keep x, d_1..d_a (P+a+1 tokens): the KV caches simply truncate, but Gated DeltaNet
             conv windows and recurrent states are overwritten in place and must be restored.

Rollback strategies (a target chooses; `ReferenceSpecTarget(rollback=...)` has both):
  "recompute"  snapshot the recurrent states before verify (a copy of a fixed-size state, no
               weights read); after acceptance restore it and re-run the a+1 kept tokens. Exact
               and simple; costs a second target forward over a+1 tokens when a < K (a full
               weight read on a GPU, i.e. the price of one more decode step).
  "states"     keep the recurrent state after every verified position and restore the one at
               position a. The reference runs verify token by token to get them; a GPU Gated
               DeltaNet kernel can write state_t for each of its K+1 steps for (K+1) x state
               bytes of traffic (estimate: n_v x d_k x d_v float32 = 32 x 128 x 128 x 4 B =
               2 MiB a layer, 24 layers -> 48 MiB a position, 9 positions ~0.1 ms at H200
               bandwidth), far below a recompute's weight read. A middle ground is to keep the
               per-position GDN *inputs* (q, k, v, g, beta, conv inputs) and re-run only the
               recurrence from the snapshot: no weights, one state read/write per layer.
  Which is cheaper on the GPU is measured there (the statistics keep draft / verify / rollback
  time apart); both are exact.

The MTP head is itself a one-layer causal model over (hidden_t, token_{t+1}) pairs with a KV
cache (slot t = pair t). The drafter feeds each true pair exactly once: at the start of a round
it truncates the head back to the last true pair, feeds the pairs the previous round accepted
plus (h_{P-1}, x) in one call (whose last row is d_1's logits), then chains the K-1 drafts.

Test modes: draft "oracle" is the target's own greedy continuation (acceptance 100% at
temperature 0), "adversarial" is always a token other than the target's argmax (acceptance 0%),
"mixed" is the oracle corrupted at a random depth (every partial acceptance length occurs).
All must reproduce plain greedy decoding token for token -- the exactness gate (`spec_check`,
`bw24nb spec --check`).

Speed levers, each exact by construction (only the draft changes):
  FR-Spec trim         the draft LM head over a frequency-ranked vocabulary subset (`trim`);
  confidence gating    stop drafting when the draft's top probability falls below a threshold
                       ("round": decide once per round from d_1, so a round is either K+1 or 1
                       tokens -- two static shapes, two CUDA graphs; "step": stop at the first
                       unsure draft);
  depth table          the draft depth per content class (code / math / prose), `DepthTable`.

A target is anything that implements `SpecTarget` (below): the numpy reference through
`ReferenceSpecTarget`, the GPU engine through `engine_spec.EngineSpecTarget`.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol, Sequence

import numpy as np

from .errors import ContextOverflow, UnsupportedArchitecture
from .sampling import SamplingParams, sample_with_uniform

# Draft depth when none is given. Set from the GPU sweep (bench: `bw24nb spec --check` prints
# acceptance per depth); 3 is vLLM's usual num_speculative_tokens for Qwen3-Next/3.5 MTP.
DEFAULT_SPEC_K = 3
MAX_SPEC_K = 8
DRAFT_MODES = ("mtp", "oracle", "adversarial", "mixed")
ROLLBACKS = ("recompute", "states")
CONFIDENCE_MODES = ("round", "step")


# ============================================================================ the target protocol

@dataclass
class Rows:
    """What one forward (target or MTP head) hands the loop, per position.

    `argmax` is all greedy decoding needs (a GPU target reads back T int32s, not T x V floats);
    `logits` only when asked for (`want_logits`: sampling); `top_prob` for confidence gating.
    `hidden` is opaque to the loop: it only slices rows off it (`hidden[i:j]`) and hands them
    back to `mtp_feed`, so a GPU target may return device arrays."""
    argmax: np.ndarray                  # int64 [T]: greedy token after each position (vocab ids)
    hidden: object                      # [T, H]: target rows = normed final hidden (the LM
                                        # head's input, llama.cpp's h_nextn); MTP rows = its output
    logits: np.ndarray | None = None    # float [T, V] (MTP with a trim: [T, len(vocab)])
    top_prob: np.ndarray | None = None  # float [T]: max softmax at temperature 1

    @classmethod
    def from_logits(cls, logits: np.ndarray, hidden, vocab: np.ndarray | None = None) -> "Rows":
        """Host helper: argmax (mapped through `vocab` when trimmed) and top probability."""
        logits = np.atleast_2d(logits)
        j = np.argmax(logits, axis=-1)
        z = logits.astype(np.float64)
        top = 1.0 / np.exp(z - z.max(axis=-1, keepdims=True)).sum(axis=-1)
        ids = j if vocab is None else np.asarray(vocab)[j]
        return cls(ids.astype(np.int64), hidden, logits, top)


class SpecTarget(Protocol):
    """What speculative decoding needs from a model. Calls append to one sequence.

    prefill / decode / verify return `Rows` for every position they consumed; `want_logits`
    asks for host logits too (sampling). After `verify(ids)` the next call is `commit(n)`:
    keep the first n of those ids (1 <= n <= len(ids)) and forget the rest -- KV rows by
    truncation, recurrent state however the target likes (see the module doc). `snapshot` /
    `restore` return to an earlier point of the sequence (the live test drafts decode ahead
    and come back). The MTP head is a one-layer causal model over (hidden_t, token_{t+1})
    pairs: `mtp_feed(hidden[T], tokens[T])` appends T pairs and returns the draft `Rows` of
    the token after each (`hidden` of those rows = the head's normed output, which chains:
    `mtp_feed(rows.hidden[-1:], [d])` drafts the token after d); `mtp_truncate(n)` keeps n
    pairs. `vocab`: draft LM head over these ids only (FR-Spec): logits are over the subset,
    argmax already mapped back to vocabulary ids. The loop reads only the last row of a
    prefill's argmax / logits and of an `mtp_feed`'s Rows, so a target may return just that
    row there (the GPU target does: a prompt's worth of [T, V] logits does not fit)."""
    name: str
    vocab_size: int
    n_ctx: int

    @property
    def position(self) -> int: ...           # tokens consumed so far
    @property
    def has_mtp(self) -> bool: ...

    def reset(self) -> None: ...             # new sequence (MTP head included)
    def prefill(self, ids: Sequence[int], want_logits: bool = False) -> Rows: ...
    def decode(self, token: int, want_logits: bool = False) -> Rows: ...   # the plain decode path
    def verify(self, ids: Sequence[int], want_logits: bool = False) -> Rows: ...
    def commit(self, n: int) -> None: ...
    def snapshot(self) -> object: ...
    def restore(self, snap: object) -> None: ...

    @property
    def mtp_position(self) -> int: ...
    def mtp_truncate(self, n: int) -> None: ...
    def mtp_feed(self, hidden, tokens: Sequence[int], vocab: np.ndarray | None = None,
                 want_logits: bool = False) -> Rows: ...
    # optional, greedy drafting in one call (a GPU target chains the draft steps on
    # the device): `mtp_draft([(hidden, tokens), ...], k, vocab[, probs]) -> [d_1 .. d_k]`
    # (with probs=True: (drafts, their top probabilities), for confidence gating) = feeding
    # those pairs, then k - 1 chained `mtp_feed`s of the argmax (MTPDrafter.propose)


class ReferenceSpecTarget:
    """`SpecTarget` over the numpy `ReferenceModel` (CPU): exact, slow, the oracle. Always
    returns logits (the flag is for targets where they cost a transfer).

    rollback "recompute" (default): verify = snapshot + one prefill over the K+1 tokens;
    commit(n < K+1) = restore + prefill of the n kept tokens. "states": verify runs the tokens
    one decode step at a time keeping a snapshot after each; commit restores the n-th.
    """

    name = "numpy reference (CPU)"

    def __init__(self, model, n_ctx: int | None = None, rollback: str = "recompute"):
        if rollback not in ROLLBACKS:
            raise ValueError(f"rollback must be one of {ROLLBACKS}, got {rollback!r}")
        self.model = model
        self.rollback = rollback
        self.n_ctx = int(n_ctx or model.config.max_position_embeddings or 1 << 30)
        self.vocab_size = int(model.output.shape[0])
        self._pending = None          # what commit() needs after a verify

    @property
    def position(self) -> int:
        return self.model.position

    @property
    def has_mtp(self) -> bool:
        c = self.model.config
        return bool(c.mtp_num_hidden_layers) and \
            f"blk.{c.num_hidden_layers}.nextn.eh_proj.weight" in self.model.weights

    def reset(self) -> None:
        self.model.reset()
        self._pending = None

    def _forward(self, ids, step: bool) -> Rows:
        from .reference.ops import linear
        m = self.model
        normed = m.normed_hidden(m.hidden_states(ids, step=step))
        return Rows.from_logits(linear(normed, m.output), normed)   # == m.logits(h), bit for bit

    def prefill(self, ids, want_logits=False) -> Rows:
        return self._forward(ids, step=False)

    def decode(self, token, want_logits=False) -> Rows:
        return self._forward([int(token)], step=True)

    def verify(self, ids, want_logits=False) -> Rows:
        ids = [int(t) for t in ids]
        if self.rollback == "recompute":
            self._pending = (self.model.snapshot(), ids)
            return self.prefill(ids)
        rows, snaps = [], []
        for t in ids:
            rows.append(self.decode(t))
            snaps.append(self.model.snapshot())
        self._pending = snaps
        return Rows(np.concatenate([r.argmax for r in rows]), np.concatenate([r.hidden for r in rows]),
                    np.concatenate([r.logits for r in rows]), np.concatenate([r.top_prob for r in rows]))

    def commit(self, n: int) -> None:
        if self._pending is None:
            raise RuntimeError("commit() without a verify() before it")
        pending, self._pending = self._pending, None
        if self.rollback == "recompute":
            snap, ids = pending
            if not 1 <= n <= len(ids):
                raise ValueError(f"commit({n}) after verifying {len(ids)} tokens")
            if n < len(ids):
                self.model.restore(snap)
                self.model.hidden_states(ids[:n])     # recompute: the same prefill path
        else:
            if not 1 <= n <= len(pending):
                raise ValueError(f"commit({n}) after verifying {len(pending)} tokens")
            if n < len(pending):
                self.model.restore(pending[n - 1])

    def snapshot(self):
        return self.model.snapshot()

    def restore(self, snap) -> None:
        self.model.restore(snap)

    @property
    def mtp_position(self) -> int:
        return self.model.mtp.position

    def mtp_truncate(self, n: int) -> None:
        self.model.mtp.truncate(n)

    def mtp_feed(self, hidden, tokens, vocab=None, want_logits=False) -> Rows:
        logits, out = self.model.mtp_forward(hidden, tokens, vocab)
        return Rows.from_logits(logits, out, vocab)


# ============================================================================ sampling pieces

def sampling_probs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The distribution `sampling.sample_with_uniform` draws from, as a float64 vector [V]
    (zero outside the kept top-k / top-p set). Temperature 0: one-hot on the argmax."""
    z = np.asarray(logits, dtype=np.float64).reshape(-1)
    p = np.zeros(z.size)
    if params.temperature == 0.0:
        p[int(np.argmax(z))] = 1.0
        return p
    z = z / params.temperature
    order = np.lexsort((np.arange(z.size), -z))          # the same order sampling.py uses
    if params.top_k > 0:
        order = order[: params.top_k]
    kept = np.exp(z[order] - z[order[0]])
    kept /= kept.sum()
    if params.top_p < 1.0:
        n = int(np.searchsorted(np.cumsum(kept), params.top_p, side="left")) + 1
        order, kept = order[:n], kept[:n] / kept[:n].sum()
    p[order] = kept
    return p


def pick(p: np.ndarray, u: float) -> int:
    """A token from the (unnormalised, non-negative) vector `p` with one uniform `u` in [0, 1):
    tokens by decreasing mass (ties by id), the first whose cumulative mass exceeds u * total."""
    order = np.lexsort((np.arange(p.size), -p))
    cum = np.cumsum(p[order])
    n_pos = int(np.count_nonzero(p))
    if n_pos == 0:
        raise ValueError("cannot sample from an all-zero distribution")
    i = int(np.searchsorted(cum, u * cum[-1], side="right"))
    return int(order[min(i, n_pos - 1)])


def top_probability(logits: np.ndarray) -> float:
    """The draft's confidence: max softmax(logits) at temperature 1."""
    z = np.asarray(logits, dtype=np.float64)
    return float(1.0 / np.exp(z - z.max()).sum())


def accept_greedy(argmax: Sequence[int], drafts: Sequence[int]) -> tuple[int, int]:
    """(a, next): the longest prefix of `drafts` the target's argmax agrees with, and the
    target's own token after it. `argmax[i]`: the target's greedy token after verify row i
    (row 0 is x, row i the i-th draft)."""
    a = 0
    while a < len(drafts) and int(argmax[a]) == drafts[a]:
        a += 1
    return a, int(argmax[a])


def accept_sampled(logits: np.ndarray, drafts: Sequence[int], qs: Sequence[np.ndarray],
                   params: SamplingParams, rng: np.random.Generator) -> tuple[int, int]:
    """The speculative-sampling rule. `qs[i]`: the draft distribution d_i was drawn from ([V]).
    Accept d_i with probability min(1, p(d_i)/q(d_i)); on the first rejection the token is
    drawn from norm(max(0, p - q)) -- which with the acceptances makes the emitted token
    exactly p-distributed; with all accepted the bonus token comes from the last row's p
    (drawn as `sample_with_uniform` draws, so K = 0 reproduces plain sampling bit for bit)."""
    for i, d in enumerate(drafts):
        p = sampling_probs(logits[i], params)
        q = qs[i]
        if rng.random() * q[d] < p[d]:               # u < p/q without dividing
            continue
        residual = np.maximum(p - q, 0.0)
        if residual.sum() <= 0.0:                    # p == q up to rounding: rejection had
            residual = p                             # probability ~0; p is then the answer
        return i, pick(residual, rng.random())
    return len(drafts), sample_with_uniform(logits[len(drafts)], params, rng.random())


# ============================================================================ drafters

class Drafter:
    """Proposes drafts. `begin` after the prompt's prefill, `propose(x, k)` at the start of a
    round (x: the chosen, not yet consumed token), `accepted(hidden, tokens)` after it with
    the verify rows of the kept positions and the token that followed each."""

    name = "?"

    def __init__(self, target, params: SamplingParams, rng: np.random.Generator | None,
                 confidence: float | None = None, confidence_mode: str = "round"):
        if confidence_mode not in CONFIDENCE_MODES:
            raise ValueError(f"confidence_mode must be one of {CONFIDENCE_MODES}")
        self.target, self.params, self.rng = target, params, rng
        self.confidence, self.confidence_mode = confidence, confidence_mode
        self.gated = False            # the last propose() was cut by confidence gating

    @property
    def sampling(self) -> bool:
        return self.params.temperature > 0.0

    @property
    def want_logits(self) -> bool:
        """Ask the target for logits: sampling draws from them, and confidence gating reads
        `top_prob`, which a GPU target computes from them (it returns argmax only otherwise)."""
        return self.sampling or self.confidence is not None

    def begin(self, prompt: list[int], hidden, x: int) -> None:
        pass

    def propose(self, x: int, k: int) -> tuple[list[int], list[np.ndarray | None]]:
        raise NotImplementedError

    def accepted(self, hidden, tokens: list[int]) -> None:
        pass

    def _unsure(self, i: int, top_prob, j: int = 0) -> bool:
        """Confidence gating: stop before draft i (0-based), drafted from the distribution whose
        top probability is top_prob[j] (a Rows' `top_prob`, or the device chain's list), when
        that is low ("round": only the round's first draft decides)."""
        if self.confidence is None or (self.confidence_mode == "round" and i > 0):
            return False
        if top_prob[j] >= self.confidence:
            return False
        self.gated = True
        return True

    def _choose(self, rows: Rows, j: int = 0, vocab: np.ndarray | None = None):
        """A draft token from row j and the full-size distribution it was drawn from (None at
        temperature 0: acceptance is then argmax equality)."""
        if not self.sampling:
            return int(rows.argmax[j]), None
        q = sampling_probs(rows.logits[j], self.params)
        local = pick(q, self.rng.random())
        if vocab is None:
            return local, q
        full = np.zeros(self.target.vocab_size)
        full[vocab] = q
        return int(vocab[local]), full


class MTPDrafter(Drafter):
    """Drafts with the target's MTP head (trimmed LM head when `vocab` is given)."""

    name = "mtp"

    def __init__(self, target, params, rng, vocab=None, **kw):
        super().__init__(target, params, rng, **kw)
        if not target.has_mtp:
            raise UnsupportedArchitecture(
                f"{target.name}: this checkpoint has no MTP head (nextn tensors); use "
                f"--draft-mode oracle/adversarial/mixed, or a Qwen3.5/3.6 checkpoint with MTP")
        self.vocab = None if vocab is None else np.asarray(vocab, dtype=np.int64)
        self.base = 0                 # MTP pairs fed that are true (the rest are drafts)
        self.pending: list[tuple[object, list[int]]] = []   # true pairs not fed yet

    def begin(self, prompt, hidden, x):
        self.base = self.target.mtp_position          # 0 after reset
        self.pending = [(hidden, list(prompt[1:]) + [int(x)])]   # pairs (h_t, t_{t+1}), t < P

    def propose(self, x, k):
        self.gated = False
        if k == 0:
            return [], []
        t, want = self.target, self.want_logits
        t.mtp_truncate(self.base)                     # drop last round's chained drafts
        if not self.sampling and hasattr(t, "mtp_draft"):    # greedy: the device chain
            if self.confidence is None:
                drafts = t.mtp_draft(self.pending, k, self.vocab)
            else:               # gated on the top probabilities the chain computed on the device
                drafts, probs = t.mtp_draft(self.pending, k, self.vocab, probs=True)
                drafts = drafts[:next((i for i in range(k) if self._unsure(i, probs, i)), k)]
            self.base += sum(len(tokens) for _, tokens in self.pending)
            self.pending = []
            return drafts, [None] * len(drafts)
        for hidden, tokens in self.pending:           # usually one chunk; the last row drafts d_1
            rows = t.mtp_feed(hidden, tokens, self.vocab, want)
            self.base += len(tokens)
        self.pending = []
        drafts, qs, j = [], [], rows.argmax.shape[0] - 1
        for i in range(k):
            if self._unsure(i, rows.top_prob, j):
                break
            d, q = self._choose(rows, j, self.vocab)
            drafts.append(d)
            qs.append(q)
            if i + 1 < k:
                rows, j = t.mtp_feed(rows.hidden[j:j + 1], [d], self.vocab, want), 0
        return drafts, qs

    def accepted(self, hidden, tokens):
        self.pending.append((hidden, [int(x) for x in tokens]))


class OracleDrafter(Drafter):
    """The target's own continuation, by decoding ahead and restoring a snapshot: every draft
    agrees with the target (greedy: acceptance 100%; sampling: q = p, so min(1, p/q) = 1)."""

    name = "oracle"

    def propose(self, x, k):
        self.gated = False
        if k == 0:
            return [], []
        t = self.target
        snap = t.snapshot()
        drafts, qs, tok = [], [], x
        for i in range(k):
            rows = t.decode(tok, self.want_logits)
            if self._unsure(i, rows.top_prob):
                break
            tok, q = self._choose(rows)
            drafts.append(tok)
            qs.append(q)
        t.restore(snap)
        return drafts, qs


def _one_hot(d: int, n: int) -> np.ndarray:
    q = np.zeros(n)
    q[d] = 1.0
    return q


class AdversarialDrafter(Drafter):
    """Always wrong: d_1 = (the target's argmax + 1) mod V, so every round rejects at depth 1
    (greedy acceptance 0%). Deterministic drafts: q is one-hot. Not confidence-gated."""

    name = "adversarial"

    def propose(self, x, k):
        self.gated = False
        if k == 0:
            return [], []
        t = self.target
        snap = t.snapshot()
        g = int(t.decode(x).argmax[0])
        t.restore(snap)
        V = t.vocab_size
        drafts = [(g + 1 + i) % V for i in range(k)]
        return drafts, [_one_hot(d, V) if self.sampling else None for d in drafts]


class MixedDrafter(OracleDrafter):
    """The oracle continuation corrupted at a random depth j in 0..k (j = k: no corruption), so
    each round accepts exactly j drafts (greedy) and every rollback length occurs. `planned`
    records j per round; its own seeded generator keeps it off the acceptance draws."""

    name = "mixed"

    def __init__(self, target, params, rng, seed: int = 0, **kw):
        super().__init__(target, params, rng, **kw)
        self.mix_rng = np.random.default_rng(seed)
        self.planned: list[int] = []

    def propose(self, x, k):
        drafts, qs = super().propose(x, k)
        if drafts:
            j = int(self.mix_rng.integers(0, len(drafts) + 1))
            if j < len(drafts):
                drafts[j] = (drafts[j] + 1) % self.target.vocab_size
                if qs[j] is not None:
                    qs[j] = _one_hot(drafts[j], self.target.vocab_size)
            self.planned.append(j)
        return drafts, qs


class ScriptedDrafter(Drafter):
    """Test drafts read off a known greedy continuation (`reference`: plain greedy's tokens
    after a prompt of `prompt_len`) instead of decoding ahead: the same drafts as the live
    oracle / adversarial / mixed drafters at no target cost, so the gate can run every K
    cheaply. Greedy only. Off the script (the output already differs from the reference) it
    proposes nothing and sets `off_script`; the gate reports the difference."""

    def __init__(self, target, params, rng, reference: Sequence[int], prompt_len: int,
                 mode: str = "oracle", seed: int = 0, **kw):
        super().__init__(target, params, rng, **kw)
        if params.temperature != 0.0:
            raise ValueError("scripted drafts follow the greedy continuation: temperature 0 only")
        if mode not in ("oracle", "adversarial", "mixed"):
            raise ValueError(f"scripted draft mode must be oracle/adversarial/mixed, got {mode!r}")
        self.name = f"scripted-{mode}"
        self.mode, self.reference, self.prompt_len = mode, [int(t) for t in reference], prompt_len
        self.mix_rng = np.random.default_rng(seed)
        self.planned: list[int] = []
        self.off_script = False

    def propose(self, x, k):
        self.gated = False
        i = self.target.position - self.prompt_len          # x is reference[i]
        if k == 0:
            return [], []
        if not (0 <= i < len(self.reference)) or self.reference[i] != x:
            self.off_script = True
            return [], []
        V = self.target.vocab_size
        drafts = self.reference[i + 1: i + 1 + k]
        if self.mode == "adversarial":
            drafts = [(d + 1) % V for d in drafts]
        elif self.mode == "mixed" and drafts:
            j = int(self.mix_rng.integers(0, len(drafts) + 1))
            if j < len(drafts):
                drafts[j] = (drafts[j] + 1) % V
            self.planned.append(j)
        return drafts, [None] * len(drafts)


def make_drafter(mode: str, target, params: SamplingParams, rng: np.random.Generator,
                 trim=None, confidence=None, confidence_mode="round", seed: int = 0) -> Drafter:
    kw = dict(confidence=confidence, confidence_mode=confidence_mode)
    if mode == "mtp":
        return MTPDrafter(target, params, rng, vocab=trim, **kw)
    if trim is not None:
        raise ValueError("a vocabulary trim applies to the MTP draft head only")
    if mode == "oracle":
        return OracleDrafter(target, params, rng, **kw)
    if mode == "adversarial":
        return AdversarialDrafter(target, params, rng, **kw)
    if mode == "mixed":
        return MixedDrafter(target, params, rng, seed=seed, **kw)
    raise ValueError(f"draft mode must be one of {DRAFT_MODES}, got {mode!r}")


# ============================================================================ the loop

@dataclass
class RoundTrace:
    position: int          # target position at the round's start (x sits there)
    drafts: list[int]
    accepted: int
    next_token: int


@dataclass
class SpecStats:
    """Acceptance statistics of one speculative run (printed by the CLI)."""
    k: int = 0                     # largest draft depth asked for
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    gated_rounds: int = 0          # rounds cut short by confidence gating
    generated: int = 0             # tokens emitted (prefill's first token included)
    drafted_at_depth: list[int] = field(default_factory=list)    # [i]: rounds with a draft at depth i+1
    accepted_at_depth: list[int] = field(default_factory=list)   # [i]: ... where it was accepted
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    rollback_s: float = 0.0
    finish_reason: str | None = None
    trace: list[RoundTrace] | None = None

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted(self) -> float:
        """Accepted drafts per round."""
        return self.accepted / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_round(self) -> float:
        """Tokens emitted per target forward (accepted + the target's own): the speed-up bound."""
        return (self.accepted + self.rounds) / self.rounds if self.rounds else 0.0

    def _count(self, depth: int, accepted: bool):
        while len(self.drafted_at_depth) <= depth:
            self.drafted_at_depth.append(0)
            self.accepted_at_depth.append(0)
        self.drafted_at_depth[depth] += 1
        self.accepted_at_depth[depth] += int(accepted)

    def summary(self) -> str:
        per_depth = " ".join(f"{a}/{d}" for a, d in zip(self.accepted_at_depth, self.drafted_at_depth))
        ms = lambda s: 1e3 * s / max(self.rounds, 1)   # noqa: E731
        return (f"acceptance {100 * self.acceptance_rate:.1f}% ({self.accepted}/{self.drafted} drafts), "
                f"mean accepted {self.mean_accepted:.2f}/round, {self.tokens_per_round:.2f} tok/round, "
                f"{self.rounds} rounds" + (f" ({self.gated_rounds} gated)" if self.gated_rounds else "")
                + (f"; accepted/drafted by depth: {per_depth}" if per_depth else "")
                + f"; per round: draft {ms(self.draft_s):.2f} ms, verify {ms(self.verify_s):.2f} ms, "
                  f"rollback {ms(self.rollback_s):.2f} ms")


def _next_token(rows: Rows, row: int, params: SamplingParams, rng: np.random.Generator) -> int:
    """The target's token from one row, drawn as `sampling.Sampler` draws (one uniform per
    token when sampling, none when greedy)."""
    if params.temperature == 0.0:
        return int(rows.argmax[row])
    return sample_with_uniform(rows.logits[row], params, float(rng.random()))


def speculative_stream(target, prompt_ids: Sequence[int], max_tokens: int,
                       k: int | Callable[[list[int]], int] = DEFAULT_SPEC_K,
                       sampling: SamplingParams = SamplingParams(), draft_mode: str | Drafter = "mtp",
                       trim=None, confidence: float | None = None, confidence_mode: str = "round",
                       eos_ids=(), stats: SpecStats | None = None, trace: bool = False,
                       seed: int = 0) -> Iterator[list[int]]:
    """Speculative decoding as a generator of token batches (one per round; EOS excluded).

    `k`: draft depth, or a function of the tokens generated so far (a depth table). `draft_mode`
    "mtp" | "oracle" | "adversarial" | "mixed" or a `Drafter`. `trim`: FR-Spec vocabulary
    subset for the MTP draft head. `confidence`: gating threshold (see module doc). `seed`:
    the mixed drafter's corruption depths. `stats` is filled as it goes."""
    params = sampling.validate()
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise ValueError("the prompt is empty")
    if len(prompt) >= target.n_ctx:
        raise ContextOverflow(f"the prompt has {len(prompt)} tokens but the context holds "
                              f"{target.n_ctx}; shorten the prompt or raise --ctx")
    depth = k if callable(k) else (lambda _out, _k=int(k): _k)
    eos = {int(e) for e in eos_ids}
    rng = np.random.default_rng(params.seed)
    if isinstance(draft_mode, Drafter):
        if trim is not None or confidence is not None:
            raise ValueError("trim / confidence configure a drafter built here; a Drafter "
                             "instance carries its own")
        drafter = draft_mode
    else:
        drafter = make_drafter(draft_mode, target, params, rng, trim=trim, confidence=confidence,
                               confidence_mode=confidence_mode, seed=seed)
    stats = stats if stats is not None else SpecStats()
    stats.k = 0 if callable(k) else int(k)
    if trace:
        stats.trace = []

    want = params.temperature > 0.0
    target.reset()
    t0 = time.perf_counter()
    rows = target.prefill(prompt, want)
    stats.prefill_s = time.perf_counter() - t0
    if max_tokens <= 0:
        stats.finish_reason = "length"
        return
    x = _next_token(rows, -1, params, rng)
    if x in eos:
        stats.finish_reason = "stop"
        return
    stats.generated = 1
    yield [x]
    drafter.begin(prompt, rows.hidden, x)
    out = [x]
    while True:
        if len(out) >= max_tokens:
            stats.finish_reason = "length"
            return
        if target.position + 1 > target.n_ctx:
            stats.finish_reason = "length"
            return
        k_r = int(depth(out))
        if k_r < 0:
            raise ValueError(f"draft depth must be >= 0, got {k_r}")
        stats.k = max(stats.k, k_r)
        k_r = min(k_r, max_tokens - len(out) - 1, target.n_ctx - target.position - 1)

        t0 = time.perf_counter()
        drafts, qs = drafter.propose(x, k_r)
        t1 = time.perf_counter()
        rows = target.verify([x] + drafts, want)
        t2 = time.perf_counter()
        if want:
            a, nxt = accept_sampled(rows.logits, drafts, qs, params, rng)
        else:
            a, nxt = accept_greedy(rows.argmax, drafts)
        target.commit(a + 1)
        t3 = time.perf_counter()
        drafter.accepted(rows.hidden[: a + 1], drafts[:a] + [nxt])

        stats.draft_s += t1 - t0
        stats.verify_s += t2 - t1
        stats.rollback_s += t3 - t2
        stats.rounds += 1
        stats.drafted += len(drafts)
        stats.accepted += a
        stats.gated_rounds += int(drafter.gated)
        for i in range(len(drafts)):
            stats._count(i, i < a)
        if stats.trace is not None:
            stats.trace.append(RoundTrace(target.position - a - 1, list(drafts), a, nxt))

        new = drafts[:a] + [nxt]
        for j, tok in enumerate(new):
            if tok in eos:
                new = new[:j]
                stats.finish_reason = "stop"
                break
        new = new[: max_tokens - len(out)]
        out += new
        stats.generated += len(new)
        if new:
            yield new
        if stats.finish_reason == "stop":
            return
        x = nxt


def speculative_generate(target, prompt_ids, max_tokens: int, k=DEFAULT_SPEC_K,
                         sampling: SamplingParams = SamplingParams(), draft_mode="mtp", trim=None,
                         confidence=None, confidence_mode="round", eos_ids=(), trace=False,
                         seed: int = 0) -> tuple[list[int], SpecStats]:
    """`speculative_stream` collected: (tokens, stats)."""
    stats = SpecStats()
    toks: list[int] = []
    for batch in speculative_stream(target, prompt_ids, max_tokens, k, sampling, draft_mode, trim,
                                    confidence, confidence_mode, eos_ids, stats, trace, seed):
        toks += batch
    return toks, stats


def plain_generate(target, prompt_ids, n: int, sampling: SamplingParams = SamplingParams(),
                   eos_ids=()) -> list[int]:
    """Prefill then one decode step per token (the `generate` loop's arithmetic, with the
    same draws as `sampling.Sampler`): the reference speculative decoding must reproduce."""
    params = sampling.validate()
    rng = np.random.default_rng(params.seed)
    want = params.temperature > 0.0
    eos = {int(e) for e in eos_ids}
    target.reset()
    rows, row = target.prefill([int(t) for t in prompt_ids], want), -1
    out: list[int] = []
    while len(out) < n:
        tok = _next_token(rows, row, params, rng)
        if tok in eos:
            break
        out.append(tok)
        if len(out) >= n or target.position + 1 > target.n_ctx:
            break
        rows, row = target.decode(tok, want), 0
    return out


def plain_greedy(target, prompt_ids, n: int, eos_ids=()) -> list[int]:
    return plain_generate(target, prompt_ids, n, SamplingParams(), eos_ids)


@dataclass
class CheckRow:
    k: int
    match: bool
    first_diff: int | None          # index of the first differing token (None: identical)
    stats: SpecStats

    @property
    def gate(self) -> str:
        return "MATCH" if self.match else f"MISMATCH (first difference at token {self.first_diff})"


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def spec_check(target, prompt_ids, n: int = 64, ks=range(1, MAX_SPEC_K + 1), draft_mode="mtp",
               reference: list[int] | None = None, live: bool = True, **kw) -> list[CheckRow]:
    """The exactness gate: greedy speculative decoding at each K against plain greedy decoding
    (computed once, or given as `reference`). Test draft modes run live (the target decodes
    ahead from a snapshot) or, `live=False` and ungated, scripted from the reference
    (`ScriptedDrafter`).
    Extra keywords go to `speculative_generate`."""
    ref = reference if reference is not None else plain_greedy(target, prompt_ids, n)
    rows = []
    for k in ks:
        mode = draft_mode
        if not live and draft_mode in ("oracle", "adversarial", "mixed") \
                and kw.get("trim") is None and kw.get("confidence") is None:
            mode = ScriptedDrafter(target, SamplingParams(), None, ref, len(prompt_ids), draft_mode,
                                   seed=kw.get("seed", 0))
        toks, stats = speculative_generate(target, prompt_ids, n, k, draft_mode=mode, **kw)
        d = first_difference(toks, ref)
        rows.append(CheckRow(int(k), d is None, d, stats))
    return rows


# ============================================================================ FR-Spec vocabulary

def _check_vocab(ids: np.ndarray, vocab_size: int | None, origin: str) -> np.ndarray:
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    if ids.size == 0:
        raise ValueError(f"{origin}: the draft vocabulary is empty")
    if ids.min() < 0 or (vocab_size is not None and ids.max() >= vocab_size):
        raise ValueError(f"{origin}: token ids must lie in [0, {vocab_size})")
    if np.unique(ids).size != ids.size:
        raise ValueError(f"{origin}: the draft vocabulary repeats token ids")
    return ids


def draft_vocab_from_tokens(token_ids, size: int, vocab_size: int) -> np.ndarray:
    """FR-Spec subset from a tokenized corpus: the `size` most frequent ids (ties: lower id
    first; ids never seen fill up in id order), most frequent first."""
    counts = np.bincount(np.asarray(token_ids, dtype=np.int64).reshape(-1), minlength=vocab_size)
    order = np.lexsort((np.arange(counts.size), -counts))
    return _check_vocab(order[: min(size, vocab_size)], vocab_size, "corpus")


def load_draft_vocab(path, size: int | None = None, vocab_size: int | None = None) -> np.ndarray:
    """A frequency-ranked id list (.npy, or text: ids separated by whitespace or commas, most
    frequent first); the first `size` are kept."""
    path = str(path)
    if path.endswith(".npy"):
        ids = np.load(path)
    else:
        with open(path) as f:
            ids = np.array([int(t) for t in re.split(r"[\s,]+", f.read()) if t], dtype=np.int64)
    if size is not None:
        ids = ids[:size]
    return _check_vocab(ids, vocab_size, path)


def save_draft_vocab(path, ids) -> None:
    """Write a ranked id list as `load_draft_vocab` reads it (text, one id a line)."""
    with open(path, "w") as f:
        f.write("\n".join(str(int(i)) for i in ids) + "\n")


# ============================================================================ depth table

CONTENT_CLASSES = ("code", "math", "prose")
_CODE = re.compile(r"\bdef |\bclass |\breturn\b|\bimport |#include|\bfunction\b|\bconst |\blet |"
                   r"\bfn |=>|::|[{};]|^\s{4,}\S|\)\s*:", re.M)
_MATH = re.compile(r"\d\s*[-+*/^=<>]\s*[\d(a-z]|\\frac|\\sum|\\int|\$|[=≤≥∑∫√]")


def content_class(text: str) -> str:
    """A cheap guess at what is being written: "code", "math" or "prose" (by how dense code
    punctuation / keywords and arithmetic are per word)."""
    words = max(len(text.split()), 1)
    code, math = len(_CODE.findall(text)), len(_MATH.findall(text))
    if code >= 2 and code >= 0.1 * words:
        return "code"
    if math >= 2 and math >= 0.1 * words:
        return "math"
    return "prose"


@dataclass
class DepthTable:
    """Draft depth per content class (code drafts deeper: it is more predictable). The values
    come from per-class acceptance measurements on the GPU; `parse("code=6,math=4,prose=2")`."""
    depths: dict[str, int]
    default: int = DEFAULT_SPEC_K
    window: int = 64              # recent tokens the class is judged on

    @classmethod
    def parse(cls, spec: str, default: int = DEFAULT_SPEC_K) -> "DepthTable":
        depths = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            name, sep, val = part.partition("=")
            name = name.strip()
            if not sep or (name not in CONTENT_CLASSES and name != "default"):
                raise ValueError(f"depth table entry {part!r}: expected CLASS=K with CLASS one of "
                                 f"{CONTENT_CLASSES + ('default',)}")
            k = int(val)
            if not 0 <= k <= MAX_SPEC_K:
                raise ValueError(f"depth table entry {part!r}: K must lie in 0..{MAX_SPEC_K}")
            if name == "default":
                default = k
            else:
                depths[name] = k
        return cls(depths, default)

    def depth(self, text: str) -> int:
        return self.depths.get(content_class(text), self.default)

    def depth_fn(self, decode: Callable[[list[int]], str], prompt_text: str = "") -> Callable[[list[int]], int]:
        """A per-round depth for `speculative_stream`: the class of the prompt's tail plus the
        last `window` generated tokens (decoded with `decode`)."""
        tail = prompt_text[-4 * self.window:]

        def k_for(out: list[int]) -> int:
            recent = out[-self.window:]
            return self.depth(tail + (decode(recent) if recent else ""))
        return k_for


# ============================================================================ loading, CLI

def spec_target_for(backend, n_ctx: int | None = None, rollback: str | None = None):
    """A `SpecTarget` for a `generate.Backend`: the reference backend's model or the GPU
    engine wrapped (`EngineSpecTarget`), or the backend itself when it implements the
    protocol. `rollback` None: the target's own default -- "recompute" on the numpy reference
    (its "states" runs K+1 one-row forwards), "states" on the GPU (its kernels keep every
    verified row's state: ~0.7 ms a rollback against ~7 ms for "recompute" on the 9B shape,
    research/tune-data/spec.jsonl)."""
    from .backends import ReferenceBackend
    if isinstance(backend, ReferenceBackend):
        return ReferenceSpecTarget(backend.model, n_ctx or backend.n_ctx, rollback or "recompute")
    from .engine import Engine
    if isinstance(backend, Engine):
        from .engine_spec import EngineSpecTarget
        return EngineSpecTarget(backend, rollback or "states")
    if all(hasattr(backend, a) for a in ("verify", "commit", "mtp_feed", "snapshot")):
        return backend
    raise UnsupportedArchitecture(f"{backend.name} does not implement speculative decoding "
                                  f"(SpecTarget) yet; use --backend cpu")


def load_spec_target(path, n_ctx: int = 4096, which: str = "auto", rollback: str | None = None,
                     log=print):
    """Open `path` -> (SpecTarget, source, tokenizer or None). The tokenizer is optional here
    (tiny test checkpoints have none; prompts then come as ids)."""
    from . import device
    from .backends import load_tokenizer
    from .errors import Bw24Error
    from .formats import open_model

    source = open_model(path)
    try:
        tokenizer = load_tokenizer(source)
    except Bw24Error as e:
        log(f"no tokenizer ({e}); give the prompt as --prompt-ids")
        tokenizer = None
    n_ctx = min(n_ctx, source.config.max_position_embeddings or n_ctx)
    if which == "gpu" or (which == "auto" and device.gpu_present()):
        from .engine import Engine
        engine = Engine(source, n_ctx=n_ctx, log=log)
        return spec_target_for(engine, n_ctx, rollback), source, tokenizer
    from .models import load_weights
    from .reference.model import ReferenceModel
    model = ReferenceModel(source.config, load_weights(source))
    return ReferenceSpecTarget(model, n_ctx, rollback or "recompute"), source, tokenizer


def resolve_draft_vocab(size: int, file=None, corpus=None, tokenizer=None,
                        vocab_size: int | None = None) -> np.ndarray | None:
    """The CLI's FR-Spec options -> the subset (None: full vocabulary)."""
    if file and corpus:
        raise ValueError("give --draft-vocab-file or --draft-vocab-corpus, not both")
    if file:
        return load_draft_vocab(file, size or None, vocab_size)
    if corpus:
        if tokenizer is None:
            raise ValueError("--draft-vocab-corpus needs the model's tokenizer")
        with open(corpus, encoding="utf-8") as f:
            ids = tokenizer.encode(f.read())
        return draft_vocab_from_tokens(ids, size or vocab_size, vocab_size)
    if size:
        raise ValueError("--draft-vocab N needs --draft-vocab-file or --draft-vocab-corpus "
                         "(the frequency ranking)")
    return None


def _parse_ids(text: str) -> list[int]:
    return [int(t) for t in re.split(r"[\s,]+", text.strip()) if t]


def gen_speculative(lm, ids, max_tokens: int, sampling: SamplingParams, spec_k: int,
                    gate: bool = True, echo=print, err=print, **kw) -> SpecStats:
    """`bw24nb gen --spec-k K`: stream speculative output of `lm` (backends.LoadedModel),
    after the spec gate (greedy: the same tokens as plain greedy decoding) when `gate`."""
    target = spec_target_for(lm.backend)
    eos = tuple(lm.tokenizer.eos_ids)
    if gate and sampling.temperature == 0.0:
        ref = plain_greedy(target, ids, max_tokens, eos)
        toks, _ = speculative_generate(target, ids, max_tokens, spec_k, sampling, eos_ids=eos, **kw)
        d = first_difference(toks, ref)
        err(f"spec gate (K={spec_k}): " + ("MATCH" if d is None else f"MISMATCH (first difference "
                                                                     f"at token {d})"))
    stats = SpecStats()
    decoder = lm.tokenizer.stream_decoder()
    for batch in speculative_stream(target, ids, max_tokens, spec_k, sampling, eos_ids=eos,
                                    stats=stats, **kw):
        echo("".join(decoder.push(t) for t in batch))
    echo(decoder.flush())
    err(f"spec K={spec_k}: {stats.summary()}")
    return stats


def register_cli(main) -> None:
    """Add `bw24nb spec` to the click group `main` (cli.py calls this)."""
    import click

    @main.command("spec")
    @click.argument("model", required=False)
    @click.option("--prompt", "-p", default="Write a Python function that reverses a string.")
    @click.option("--prompt-ids", default=None,
                  help="Comma-separated token ids instead of --prompt (checkpoints without a tokenizer).")
    @click.option("--chat/--no-chat", default=False, help="Wrap the prompt in the chat template.")
    @click.option("--spec-k", default=DEFAULT_SPEC_K, type=click.IntRange(0, MAX_SPEC_K),
                  help="Draft depth K (tokens proposed per round).")
    @click.option("--check", is_flag=True,
                  help=f"Exactness gate: K = 1..{MAX_SPEC_K} against plain greedy decoding; exit 1 on MISMATCH.")
    @click.option("--max-tokens", "-n", default=64, type=click.IntRange(1))
    @click.option("--draft-mode", type=click.Choice(DRAFT_MODES), default="mtp",
                  help="mtp: the model's MTP head; oracle / adversarial / mixed: test drafts "
                       "(always right / always wrong / wrong at a random depth).")
    @click.option("--temperature", default=0.0, type=click.FloatRange(0.0))
    @click.option("--top-k", default=0, type=click.IntRange(0))
    @click.option("--top-p", default=1.0, type=click.FloatRange(0.0, 1.0, min_open=True))
    @click.option("--seed", default=None, type=int)
    @click.option("--draft-vocab", default=0, type=click.IntRange(0),
                  help="FR-Spec: draft LM head over the N most frequent tokens (0: full vocabulary).")
    @click.option("--draft-vocab-file", default=None, type=click.Path(exists=True, dir_okay=False),
                  help="Frequency-ranked token ids (text or .npy), most frequent first.")
    @click.option("--draft-vocab-corpus", default=None, type=click.Path(exists=True, dir_okay=False),
                  help="Text file to rank token frequencies on (needs the tokenizer).")
    @click.option("--confidence", default=None, type=click.FloatRange(0.0, 1.0),
                  help="Stop drafting when the draft's top probability falls below this.")
    @click.option("--confidence-mode", type=click.Choice(CONFIDENCE_MODES), default="round",
                  help="round: decide once per round from the first draft; step: per draft.")
    @click.option("--depth-table", default=None,
                  help="Draft depth per content class, e.g. 'code=6,math=4,prose=2' (overrides --spec-k).")
    @click.option("--rollback", type=click.Choice(ROLLBACKS), default=None,
                  help="How rejected drafts leave the recurrent (Gated DeltaNet) state "
                       "(default: states on the GPU, recompute on the CPU reference).")
    @click.option("--ctx", default=4096, type=click.IntRange(16), help="Context length (tokens).")
    @click.option("--backend", type=click.Choice(["auto", "gpu", "cpu"]), default="auto")
    def spec(model, prompt, prompt_ids, chat, spec_k, check, max_tokens, draft_mode, temperature,
             top_k, top_p, seed, draft_vocab, draft_vocab_file, draft_vocab_corpus, confidence,
             confidence_mode, depth_table, rollback, ctx, backend):
        """Speculative decoding with the MTP head: gate against plain greedy, acceptance stats."""
        from .cli import _model_path

        log = lambda m: click.echo(m, err=True)   # noqa: E731
        target, source, tok = load_spec_target(_model_path(model), ctx, backend, rollback, log)
        log(f"backend: {target.name}; rollback: {target.rollback}; draft: {draft_mode}")
        if prompt_ids:
            ids = _parse_ids(prompt_ids)
            text = tok.decode(ids) if tok is not None else ""
        else:
            if tok is None:
                raise click.UsageError("this checkpoint carries no tokenizer: pass --prompt-ids")
            text = tok.apply_chat_template([{"role": "user", "content": prompt}]) if chat else prompt
            ids = tok.encode(text)
        try:
            trim = resolve_draft_vocab(draft_vocab, draft_vocab_file, draft_vocab_corpus, tok,
                                       target.vocab_size)
            table = DepthTable.parse(depth_table, spec_k) if depth_table else None
        except ValueError as e:
            raise click.UsageError(str(e)) from None
        if trim is not None:
            log(f"FR-Spec: draft head over {trim.size} of {target.vocab_size} tokens")
        sampling = SamplingParams(temperature, top_k, top_p, seed)
        kw = dict(draft_mode=draft_mode, trim=trim, confidence=confidence,
                  confidence_mode=confidence_mode)

        if check:
            if temperature > 0:
                raise click.UsageError("--check compares greedy outputs; drop --temperature")
            rows = spec_check(target, ids, max_tokens, **kw)
            for r in rows:
                click.echo(f"K={r.k}: gate: {r.gate}; {r.stats.summary()}")
            bad = [r.k for r in rows if not r.match]
            click.echo(f"spec check over {max_tokens} tokens, K=1..{MAX_SPEC_K}: "
                       + ("MATCH" if not bad else f"MISMATCH at K={bad}"))
            if bad:
                raise SystemExit(1)
            return

        k = spec_k
        if table is not None:
            k = table.depth_fn(tok.decode if tok is not None else (lambda _ids: ""), text)
        eos = tuple(tok.eos_ids) if tok is not None else ()
        if temperature == 0:
            ref = plain_greedy(target, ids, max_tokens, eos)
        toks, stats = speculative_generate(target, ids, max_tokens, k, sampling, eos_ids=eos, **kw)
        if tok is not None:
            click.echo(tok.decode(toks))
        else:
            click.echo(" ".join(map(str, toks)))
        if temperature == 0:
            d = first_difference(toks, ref)
            click.echo("gate: " + ("MATCH" if d is None else f"MISMATCH (first difference at token {d})"),
                       err=True)
        else:
            click.echo("gate: n/a (temperature > 0: speculative sampling keeps the target's "
                       "distribution, not its tokens)", err=True)
        click.echo(f"K={stats.k}: {stats.summary()}; finish: {stats.finish_reason}", err=True)


__all__ = ["CONFIDENCE_MODES", "CONTENT_CLASSES", "DEFAULT_SPEC_K", "DRAFT_MODES", "MAX_SPEC_K",
           "ROLLBACKS", "AdversarialDrafter", "CheckRow", "DepthTable", "Drafter", "MTPDrafter",
           "MixedDrafter", "OracleDrafter", "ReferenceSpecTarget", "RoundTrace", "Rows", "ScriptedDrafter", "SpecStats",
           "SpecTarget", "accept_greedy", "accept_sampled", "content_class", "draft_vocab_from_tokens",
           "first_difference", "gen_speculative", "load_draft_vocab", "load_spec_target", "pick",
           "plain_generate", "plain_greedy", "register_cli", "resolve_draft_vocab", "sampling_probs",
           "save_draft_vocab", "spec_check", "spec_target_for", "speculative_generate",
           "speculative_stream", "top_probability"]
