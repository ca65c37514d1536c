"""Speculative decoding on the GPU engine: `EngineSpecTarget`, spec.py's `SpecTarget` over `Engine`.

What each call of the protocol launches (all on the engine's stream):

    prefill(ids)   the engine's prefill recipe chunk by chunk (embedding, every decoder block),
                   then the output norm of *every* row (the MTP head consumes them all) and the
                   LM head + argmax of the last row only. Eager, GEMM path.
    decode(t)      the engine's captured decode step: argmax and the normed hidden row are what
                   the graph leaves in `next_token` and `ws1.x` (4 + 4H bytes read back).
    verify(ids)    one forward over T = K+1 rows on the *decode* kernels (a rowwise
                   Workspace: multi-row matvecs that read each weight once for all rows,
                   split-K attention planned per token, the GDN kernels' T-step loops), output
                   norm + LM head + argmax of every row. Each row is bit-identical to the
                   decode step of that token, so speculative output equals plain decode by
                   construction, not just up to near-ties. One CUDA graph per T, captured on
                   first use (`_Graphs`); the host writes T ids + positions and reads back T
                   argmaxes and T hidden rows.
    commit(n)      rollback (below), then the decode graph's position is set to the new length.
    mtp_feed       the MTP head (reference/mtp.py's recipe, `ReferenceModel.mtp_forward`):
                       cat = [rms_norm(embed[t]) * enorm | rms_norm(h) * hnorm]     [T, 2H]
                       y   = decoder_block_n(eh_proj @ cat)     engine launch builders, own KV slot
                       out = rms_norm(y) * shared_head_norm;  logits = head @ out
                   T = 1 (a chained draft) runs in its own one-row workspace with split-K decode
                   attention; more rows (the prompt's pairs, a round's accepted pairs) in the
                   prefill workspace. Eager: the sampling / confidence-gated drafters' path.
    mtp_draft      greedy drafting of a whole round (`GpuMTPHead.draft`): the round's true
                   pairs (<= K+1) as one captured graph on the decode kernels, then K-1 replays
                   of a one-step graph whose input is the previous step's argmax and output row
                   (kernels/step.py `mtp_chain`); the host reads the K drafts back once.

Hidden rows (`Rows.hidden`): a verify's stay on the device (`hidden_rows`, copied out of the
verify workspace), valid until the next verify -- the loop only slices them and hands them to
the next round's MTP feed, which copies them device to device, so a round's host traffic is
the ids in and the argmaxes out. Prefill's rows (a whole prompt's, which outlive its chunks)
and decode's row come back to the host.

Rows with one LM-head row: `prefill` and `mtp_feed` evaluate the LM head for their last
position only (argmax / logits / top_prob have one row; `mtp_feed`'s hidden too, prefill's has
every row). The loop reads nothing else, and a prompt's worth of [T, V] logits would not fit
(512 x 248k floats = 0.5 GB a chunk).

Rollback of the Gated DeltaNet state after a partial acceptance (KV rows simply truncate: the
position is the length):
  "recompute"  snapshot the recurrent state before verify into a buffer allocated once
               (cache/recurrent.py, two copy kernels); on commit(n < K+1) restore it and run
               the n kept tokens through the verify path again (a graph per n, no LM head):
               about one more decode step of weight reads.
  "states"     the conv and delta-rule kernels of the verify also write the state after every
               row (`Workspace.step_states`, K+1 copies of the whole state: 48 MiB a row at
               the 9B shape, ~10 us of writes each); commit(n) copies row n-1's back (two
               copy kernels). No second forward.
Both are bit-exact (the rows are the decode step's); bench/spec_bench.py measures both, and
"states" is the default (0.5-0.9 ms a rollback against ~7 ms on the 9B shape).

Top probability (`Rows.top_prob`, for confidence gating) is computed on the host from the
logits where a call returns logits (`want_logits`). The greedy MTP drafter gates on the device
instead: `mtp_draft(..., probs=True)` adds two small kernels a draft step
(kernels/sampling.py launch_top_prob) and reads k floats back with the k drafts.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import cuda

from .cache.recurrent import RecurrentSnapshot
from .device import is_device_array
from .engine import VERIFY_ROWS, DeviceWeight, Engine, Workspace
from .errors import ContextOverflow, UnsupportedArchitecture
from .graph import CudaGraph
from .kernels import attention, embedding, norm, sampling, step
from .quant.types import row_bytes
from .spec import MAX_SPEC_K, ROLLBACKS, Rows

# LM-head rows one call evaluates: verify's K+1 at the deepest draft.
LOGIT_ROWS = MAX_SPEC_K + 1


def _top_prob(logits: np.ndarray) -> np.ndarray:
    """max softmax per row at temperature 1 (float64, as Rows.from_logits computes it)."""
    z = np.atleast_2d(logits).astype(np.float64)
    return 1.0 / np.exp(z - z.max(axis=-1, keepdims=True)).sum(axis=-1)


class _Graphs:
    """Launch lists replayed as CUDA graphs, one per key (e.g. ("verify", T)). The first call
    of a key runs the launches eagerly -- a real call, which also compiles and loads every
    kernel, as capture requires -- and then captures them; later calls replay the graph. Every
    input is device memory the caller fills first (ids, positions, hidden rows), so one graph
    serves every position."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.graphs: dict = {}

    def run(self, key, build) -> None:
        e = self.engine
        g = self.graphs.get(key)
        if g is not None:
            g.replay(e.stream)
            return
        launches = build()
        e._run(launches)
        if e.use_graph:
            with CudaGraph.capture(e.stream, programmatic=e.programmatic) as g:
                e._run(launches)
            self.graphs[key] = g

    def clear(self, prefix) -> None:
        for key in [k for k in self.graphs if k[0] == prefix]:
            self.graphs.pop(key).close()


class _HeadRows:
    """An LM head (full or FR-Spec trimmed) with its [LOGIT_ROWS, V] logits and argmax buffers."""

    def __init__(self, weight: DeviceWeight, vocab: np.ndarray | None = None):
        self.weight = weight
        self.vocab = vocab                     # row r of the weight is token vocab[r] (None: r)
        V = weight.rows
        self.logits = cuda.device_array((LOGIT_ROWS, V), np.float32)
        self.tokens = cuda.device_array(LOGIT_ROWS, np.int32)
        self.sample_ws = sampling.SampleWorkspace(V, rows=LOGIT_ROWS)

    def launches(self, engine: Engine, ws: Workspace, T: int) -> list:
        """logits[:T] = weight @ ws.x[:T] on the decode kernels (int8 rows of `ws`, a rowwise
        workspace; one weight read for all rows) + every row's argmax (one launch pair for all
        rows: 0.011 against 0.037 ms a verify at K = 3 with a pair a row, H100, decision 0040):
        row t bit-identical to the decode step's head on that row. Starts with "quant_act", so
        `Engine._norm_then` fuses it into the output norm exactly as the decode step does."""
        s, x = engine.stream, ws.x[:T]
        qL, qx = engine._quantize_input(ws, x, T, [self.weight])
        return qL + [
            ("lm_head", lambda: engine._mv(self.weight, x, self.logits[:T], T, qx=qx, rowwise=True)),
            ("argmax", lambda: sampling.launch_argmax(self.logits[:T], self.tokens,
                                                      self.sample_ws, s)),
        ]

    def launch(self, engine: Engine, x, n: int) -> None:
        """logits[:n] = weight @ x[:n] (matvec for one row, matmul for more), then the device
        argmax of each row (ties to the lowest id, as the decode graph's)."""
        s = engine.stream
        # the engine's head reads int8 activations (act_quant "q8"): so must this one, or the
        # verify rows and plain decode would see different logits (prefill-workspace buffers)
        quantize, qx = engine._quantize_input(engine.wsp, x, n, [self.weight])
        engine._run(quantize)
        engine._mv(self.weight, x, self.logits[:n], n, qx=qx)
        sampling.launch_argmax(self.logits[:n], self.tokens, self.sample_ws, s)

    def rows(self, engine: Engine, n: int, hidden: np.ndarray, want_logits: bool) -> Rows:
        """Read back the n rows' argmax (and logits): the `Rows` of one call. Synchronizes."""
        s = engine.stream
        ids = self.tokens[:n].copy_to_host(stream=s).astype(np.int64)
        logits = self.logits[:n].copy_to_host(stream=s) if want_logits else None
        s.synchronize()
        if self.vocab is not None:
            ids = self.vocab[ids]
        return Rows(ids, hidden, logits, None if logits is None else _top_prob(logits))


@dataclass
class EngineSnapshot:
    """`EngineSpecTarget.snapshot()`: enough to return to a point of the current sequence."""
    sequence: int                      # resets of the target when taken
    n_rewinds: int                     # rewinds recorded when taken (later ones may stale it)
    position: int                      # tokens consumed = KV length of every attention layer
    mtp_position: int                  # MTP pairs fed
    states: RecurrentSnapshot | None   # device copy of every conv window and SSM state


class GpuMTPHead:
    """The MTP (nextn) draft head on the device: embedding + two norms + eh_proj, then decoder
    block `num_hidden_layers` through the engine's own launch builders (its KV slot follows the
    main layers', Engine._register_mtp_slots), then its norm and LM head. The numpy reference:
    `ReferenceModel.mtp_forward` (inputs are the main model's *normed* hidden rows)."""

    def __init__(self, engine: Engine):
        e, c, w = engine, engine.config, engine.w
        self.engine = e
        self.block = b = e.mtp_blocks[0]
        self.eh_proj = w.blk(b, "nextn.eh_proj.weight")
        self.enorm = w.blk(b, "nextn.enorm.weight")
        self.hnorm = w.blk(b, "nextn.hnorm.weight")
        self.attn_norm = w.blk(b, "attn_norm.weight")
        self.post_norm = w.blk_opt(b, "ffn_norm.weight") or w.blk(b, "post_attention_norm.weight")
        # the optional nextn tensors fall back to the main model's, as in reference/mtp.py
        self.head_norm = w.blk_opt(b, "nextn.shared_head_norm.weight") or w["output_norm.weight"]
        self.embed = w.blk_opt(b, "nextn.embed_tokens.weight") or w["token_embd.weight"]
        self.head = _HeadRows(w.blk_opt(b, "nextn.shared_head_head.weight") or e.output)
        self._trimmed: tuple[bytes, _HeadRows] | None = None
        # one-row workspace for chained drafts (the engine's ws1 belongs to its decode graph:
        # its `positions` is the graph's position counter)
        n_splits = attention.decode_splits(e.n_ctx, c.num_key_value_heads)
        self.ws1 = Workspace(c, 1, n_splits)
        # a round's true pairs (<= K+1) on the decode kernels, then the chain in ws1: `draft`
        self.wsm = Workspace(c, VERIFY_ROWS, n_splits, rowwise=True)
        self.cat = cuda.device_array((e.wsp.T, 2 * c.hidden_size), np.float32)
        self.drafts = cuda.device_array(LOGIT_ROWS, np.int32)       # a round's drafts
        self.n_drafts = cuda.device_array(1, np.int32)
        self.draft_probs = cuda.device_array(LOGIT_ROWS, np.float32)   # their top probabilities
        self.graphs = _Graphs(e)
        self.position = 0                                   # pairs in the head's KV cache

    def _head_for(self, vocab) -> _HeadRows:
        """The full LM head, or its rows `vocab` gathered into a weight of their own (FR-Spec;
        built once per subset: the quantized rows are copied, not re-encoded)."""
        if vocab is None:
            return self.head
        vocab = np.asarray(vocab, dtype=np.int64)
        key = vocab.tobytes()
        if self._trimmed is None or self._trimmed[0] != key:
            full = self.head.weight
            rb = row_bytes(full.qtype, full.cols)
            rows = full.buf.copy_to_host().view(np.uint8).reshape(full.rows, rb)[vocab]
            w = DeviceWeight(cuda.to_device(np.ascontiguousarray(rows).reshape(-1)), full.qtype,
                             (vocab.size, full.cols))
            self._trimmed = (key, _HeadRows(w, vocab))
            self.graphs.clear("draft")          # graphs of an earlier subset's head
        return self._trimmed[1]

    def _launches(self, ws: Workspace, T: int) -> list:
        """The head over the first T rows of `ws` (ids, positions and the input hidden rows in
        ws.h already there); leaves the normed output rows in ws.x."""
        e, c, s = self.engine, self.engine.config, self.engine.stream
        eps, H, b = c.rms_norm_eps, c.hidden_size, self.block
        h, x, cat = ws.h[:T], ws.x[:T], self.cat[:T]
        emb = self.embed
        L = [
            ("mtp_embed", lambda: embedding.launch_embedding(emb.buf, emb.qtype, emb.rows, emb.cols,
                                                             ws.ids[:T], x, s)),
            # ORDER: embedding first, hidden second (vLLM torch.cat, llama.cpp ggml_concat); each
            # norm writes its half of the concat buffer in place (a strided [T, H] view)
            ("mtp_enorm", lambda: norm.launch_rms_norm(x, self.enorm.buf, eps, cat[:, :H], s)),
            ("mtp_hnorm", lambda: norm.launch_rms_norm(h, self.hnorm.buf, eps, cat[:, H:], s)),
            ("mtp_eh_proj", lambda: e._mv(self.eh_proj, cat, h, T, rowwise=ws.rowwise)),
            ("attn_norm", lambda: norm.launch_rms_norm(h, self.attn_norm.buf, eps, x, s)),
        ]
        L += e._attention_launches(b, ws, T)
        L.append(("ffn_norm", lambda: norm.launch_rms_norm(h, self.post_norm.buf, eps, x, s)))
        L += e._moe_launches(b, ws, T) if c.is_moe_layer(b) else e._mlp_launches(b, ws, T)
        L.append(("mtp_head_norm", lambda: norm.launch_rms_norm(h, self.head_norm.buf, eps, x, s)))
        return L

    def _check_pairs(self, hidden, tokens):
        e = self.engine
        if not is_device_array(hidden):          # verify's rows stay on the device
            hidden = np.ascontiguousarray(np.atleast_2d(np.asarray(hidden, dtype=np.float32)))
        tokens = np.asarray(tokens, dtype=np.int32).reshape(-1)
        if tokens.size == 0 or tuple(hidden.shape) != (tokens.size, e.config.hidden_size):
            raise ValueError(f"mtp_feed: {hidden.shape} hidden rows for {tokens.size} tokens "
                             f"(hidden size {e.config.hidden_size})")
        if self.position + tokens.size > e.n_ctx:
            raise ContextOverflow(f"MTP head: {self.position} + {tokens.size} pairs exceed the "
                                  f"context of {e.n_ctx}")
        return hidden, tokens

    def _fill(self, ws, hidden, tokens, start: int, T: int) -> None:
        s = self.engine.stream
        ws.ids[:T].copy_to_device(tokens[start:start + T], stream=s)
        ws.positions[:T].copy_to_device(
            np.arange(self.position, self.position + T, dtype=np.int32), stream=s)
        ws.h[:T].copy_to_device(hidden[start:start + T], stream=s)

    def _feed_eager(self, hidden, tokens):
        """Append the pairs eagerly (one-row workspace, or prefill chunks); (ws, T): where the
        last pair's normed output row is, ws.x[T - 1]."""
        e = self.engine
        ws = self.ws1 if tokens.size == 1 else e.wsp
        for start in range(0, tokens.size, ws.T):
            T = min(ws.T, tokens.size - start)
            self._fill(ws, hidden, tokens, start, T)
            e._run(self._launches(ws, T))
            self.position += T
        return ws, T

    def feed(self, hidden, tokens, vocab=None, want_logits: bool = False) -> Rows:
        """Append T pairs (normed hidden rows [T, H], next tokens [T]); the `Rows` of the last
        pair (argmax, logits, the normed output row that chains)."""
        e = self.engine
        hidden, tokens = self._check_pairs(hidden, tokens)
        ws, T = self._feed_eager(hidden, tokens)
        head = self._head_for(vocab)
        last = ws.x[T - 1:T]
        head.launch(e, last, 1)
        out = last.copy_to_host(stream=e.stream)
        return head.rows(e, 1, out, want_logits)

    def _head_row(self, head: "_HeadRows", ws: Workspace, row: int) -> list:
        """The LM head + argmax of row `row` of ws (the decode step's head launches)."""
        e = self.engine
        x = ws.x[row:row + 1]
        qL, qx = e._quantize_input(ws, x, 1, [head.weight])
        return qL + [
            ("mtp_lm_head", lambda: e._mv(head.weight, x, head.logits[:1], 1, qx=qx)),
            ("mtp_argmax", lambda: sampling.launch_argmax(head.logits[0], head.tokens[:1],
                                                          head.sample_ws, e.stream))]

    def _chain(self, head: "_HeadRows", ws: Workspace, row: int, first: bool) -> tuple:
        """The launch that makes row `row`'s draft the next chain step's input (step.mtp_chain)."""
        c1, s = self.ws1, self.engine.stream
        return ("mtp_chain", lambda: step.launch_mtp_chain(
            head.tokens, ws.x[row], c1.ids, c1.h, c1.positions, ws.positions, row, self.drafts,
            self.n_drafts, first, s))

    def _top_prob(self, head: "_HeadRows", first: bool) -> tuple:
        """The launch that puts the just-drafted token's top probability (max softmax of the
        head's logits row) into draft_probs at the draft's slot (confidence gating, on the
        device: 4 bytes a draft for the host instead of the logits row)."""
        return ("mtp_top_prob", lambda: sampling.launch_top_prob(
            head.logits[0], head.tokens[:1], head.sample_ws, self.draft_probs, self.n_drafts,
            first, self.engine.stream))

    def draft(self, chunks, k: int, vocab=None, probs: bool = False):
        """Greedy drafts on the device: append the true pairs of `chunks` ([(hidden [n, H],
        tokens [n])], the last one of <= VERIFY_ROWS pairs runs as a captured graph on the
        decode kernels), draft d_1 from the last of them, then chain k - 1 more, each step a
        replay of one captured graph whose inputs are the previous step's outputs on the device
        (step.mtp_chain). The host reads the k drafts back once: 4k bytes a round. With
        `probs`, each step also computes its draft's top probability on the device, and the
        result is (drafts, their top probabilities): 8k bytes a round."""
        e = self.engine
        gate = (lambda first: [self._top_prob(head, first)]) if probs else (lambda first: [])
        head = self._head_for(vocab)
        hkey = None if self._trimmed is None or head is self.head else hash(self._trimmed[0])
        pairs = [self._check_pairs(h, t) for h, t in chunks]
        if not pairs:
            raise ValueError("mtp draft: no pairs to feed")
        for hidden, tokens in pairs[:-1]:
            self._feed_eager(hidden, tokens)
        hidden, tokens = pairs[-1]
        n = tokens.size
        if n <= VERIFY_ROWS:
            self._fill(self.wsm, hidden, tokens, 0, n)
            self.graphs.run(("draft", "feed", n, hkey, probs), lambda: (
                self._launches(self.wsm, n) + self._head_row(head, self.wsm, n - 1)
                + gate(True) + [self._chain(head, self.wsm, n - 1, True)]))
            self.position += n
        else:                                   # a prompt's pairs: prefill chunks, eagerly
            ws, T = self._feed_eager(hidden, tokens)
            e._run(self._head_row(head, ws, T - 1) + gate(True)
                   + [self._chain(head, ws, T - 1, True)])
        for _ in range(k - 1):
            if self.position + 1 > e.n_ctx:
                raise ContextOverflow(f"MTP head: {self.position} + 1 pairs exceed the context "
                                      f"of {e.n_ctx}")
            self.graphs.run(("draft", "chain", hkey, probs), lambda: (
                self._launches(self.ws1, 1) + self._head_row(head, self.ws1, 0)
                + gate(False) + [self._chain(head, self.ws1, 0, False)]))
            self.position += 1
        ids = self.drafts[:k].copy_to_host(stream=e.stream)
        p = self.draft_probs[:k].copy_to_host(stream=e.stream) if probs else None
        e.stream.synchronize()
        ids = ids.astype(np.int64)
        drafts = [int(t) for t in (ids if head.vocab is None else head.vocab[ids])]
        return (drafts, [float(x) for x in p]) if probs else drafts


class EngineSpecTarget:
    """`SpecTarget` (bw24nb/spec.py) over the GPU `Engine`. See the module doc for what each
    call launches and the rollback strategies."""

    def __init__(self, engine: Engine, rollback: str = "states"):
        if rollback not in ROLLBACKS:
            raise ValueError(f"rollback must be one of {ROLLBACKS}, got {rollback!r}")
        self.engine = e = engine
        self.rollback = rollback
        self.name = e.name
        self.n_ctx = e.n_ctx
        self.vocab_size = e.output.rows
        self.head = _HeadRows(e.output)
        # verify / recompute: up to K+1 rows on the decode kernels (row t = decoding token t
        # alone, bit for bit), each row count's launches a CUDA graph of its own
        self.wsv = Workspace(e.config, VERIFY_ROWS, e.ws1.part_ml.shape[2], rowwise=True)
        # a verify's normed hidden rows, kept on the device for the next round's MTP feed
        self.hidden_rows = cuda.device_array((VERIFY_ROWS, e.config.hidden_size), np.float32)
        self.graphs = _Graphs(e)
        if rollback == "states" and e.rs is not None:
            self.wsv.step_states = e.rs.new_step_states(VERIFY_ROWS)
        self.mtp = GpuMTPHead(e) if e.mtp_blocks else None
        # rollback buffers, allocated once: one state copy ("recompute"), or the verify
        # workspace's step states ("states", above: K+1 copies of the whole state)
        self._before_verify = e.rs.new_snapshot() if e.rs is not None and rollback == "recompute" \
            else None
        self._pending = None            # what commit() needs after a verify
        self._sequence = 0              # reset count (a snapshot is valid within one sequence)
        self._rewinds: list[int] = []   # positions restored to since the reset

    # ------------------------------------------------------------------ state

    @property
    def position(self) -> int:
        return self.engine.position

    @property
    def has_mtp(self) -> bool:
        return self.mtp is not None

    def reset(self) -> None:
        self.engine.reset()
        if self.mtp is not None:
            self.mtp.position = 0
        self._pending = None
        self._sequence += 1
        self._rewinds = []

    # ------------------------------------------------------------------ forwards

    def _stack(self, ids: np.ndarray) -> np.ndarray:
        """Run `ids` through the main stack on the prefill path (chunks of the prefill
        workspace), appending to the sequence; the normed final hidden rows [T, H] (host)."""
        e = self.engine
        c, s, ws = e.config, e.stream, e.wsp
        if e.position + ids.size > e.n_ctx:
            raise ContextOverflow(f"{e.position} + {ids.size} tokens exceed the context of "
                                  f"{e.n_ctx}; raise --ctx")
        tok, out_norm = e.w["token_embd.weight"], e.w["output_norm.weight"]
        hidden = np.empty((ids.size, c.hidden_size), np.float32)
        for start in range(0, ids.size, ws.T):
            T = min(ws.T, ids.size - start)
            ws.ids[:T].copy_to_device(ids[start:start + T], stream=s)
            ws.positions[:T].copy_to_device(
                np.arange(e.position, e.position + T, dtype=np.int32), stream=s)
            L = [("embedding", lambda: embedding.launch_embedding(
                tok.buf, tok.qtype, tok.rows, tok.cols, ws.ids[:T], ws.h[:T], s))]
            for i in range(c.num_hidden_layers):
                L += e._layer_launches(i, ws, T)
            # every row's output norm (the engine's head norms only the last): the LM head's
            # input and what the MTP head consumes
            L.append(("output_norm", lambda: norm.launch_rms_norm(ws.h[:T], out_norm.buf,
                                                                  c.rms_norm_eps, ws.x[:T], s)))
            e._run(L)
            ws.x[:T].copy_to_host(hidden[start:start + T], stream=s)
            e.position += T
        self.engine.set_position(e.position)
        return hidden

    def prefill(self, ids, want_logits: bool = False) -> Rows:
        """Append the prompt; argmax/logits of the last position, hidden rows of all of them."""
        ids = np.asarray(ids, np.int32).reshape(-1)
        if ids.size == 0:
            raise ValueError("prefill needs at least one token")
        hidden = self._stack(ids)
        last = (ids.size - 1) % self.engine.wsp.T         # the last row of the last chunk
        self.head.launch(self.engine, self.engine.wsp.x[last:last + 1], 1)
        return self.head.rows(self.engine, 1, hidden, want_logits)

    def decode(self, token: int, want_logits: bool = False) -> Rows:
        """One token through the engine's decode step (the CUDA graph when enabled)."""
        e = self.engine
        if e.position >= e.n_ctx:
            raise ContextOverflow(f"the context of {e.n_ctx} tokens is full")
        s = e.stream
        e.ws1.ids.copy_to_device(np.array([token], np.int32), stream=s)
        e._replay_decode()
        e.position += 1
        tok = e.next_token.copy_to_host(stream=s).astype(np.int64)
        hidden = e.ws1.x.copy_to_host(stream=s)          # output norm of the step's row
        logits = e.logits.copy_to_host(stream=s)[None, :] if want_logits else None
        s.synchronize()
        return Rows(tok, hidden, logits, None if logits is None else _top_prob(logits))

    def _rows_launches(self, T: int, head: bool) -> list:
        """The main stack over the first T rows of the verify workspace (ids and positions
        already there) on the decode kernels; with `head`, the output norm of every row
        (fused with its int8 copy, as in the decode step), LM head and per-row argmax."""
        e, ws = self.engine, self.wsv
        tok = e.w["token_embd.weight"]
        L = [("embedding", lambda: embedding.launch_embedding(
            tok.buf, tok.qtype, tok.rows, tok.cols, ws.ids[:T], ws.h[:T], e.stream))]
        for i in range(e.config.num_hidden_layers):
            L += e._layer_launches(i, ws, T)
        if head:
            L += e._norm_then(("output_norm", e.w["output_norm.weight"]), ws.h[:T], ws.x[:T],
                              ws, T, self.head.launches(e, ws, T))
        return L

    def _put_rows(self, ids: np.ndarray) -> None:
        """The verify workspace's inputs: ids at the positions after the current one."""
        e, ws = self.engine, self.wsv
        T = ids.size
        ws.ids[:T].copy_to_device(ids, stream=e.stream)
        ws.positions[:T].copy_to_device(np.arange(e.position, e.position + T, dtype=np.int32),
                                        stream=e.stream)

    def _run_rows(self, ids: np.ndarray, head: bool) -> None:
        """ids (<= VERIFY_ROWS) through the stack at the current position, appending them
        (the captured graph of this row count; the first call of a count runs eagerly)."""
        e = self.engine
        T = ids.size
        if e.position + T > e.n_ctx:
            raise ContextOverflow(f"{e.position} + {T} tokens exceed the context of {e.n_ctx}; "
                                  f"raise --ctx")
        self._put_rows(ids)
        self.graphs.run(("rows", T, head), lambda: self._rows_launches(T, head))
        self.engine.set_position(e.position + T)

    def profile_verify(self, ids, replays: int = 20) -> list[tuple[str, float]]:
        """Device time (ms) of each launch of a verify over `ids` at the current position
        (Engine.time_launches); the sequence is left as it was."""
        e = self.engine
        ids = np.asarray(ids, np.int32).reshape(-1)
        snap = self.snapshot()
        self.verify(ids)                           # compiles, loads and captures every kernel
        self.restore(snap)
        self._put_rows(ids)
        rows = e.time_launches(self._rows_launches(ids.size, head=True), replays)
        self.restore(snap)
        return rows

    def time_verify(self, ids, replays: int = 20, reps: int = 5) -> list[float]:
        """Device time (ms) of one verify over `ids` at the current position, `reps` times:
        its captured graph replayed `replays` times back to back (Engine.replay_ms), without
        the ids' upload or the rows' read-back (`verify` has both). The replays rewrite the
        same KV rows; the sequence is left as it was."""
        e = self.engine
        ids = np.asarray(ids, np.int32).reshape(-1)
        T = ids.size
        snap = self.snapshot()
        self.verify(ids)                           # compiles, loads and captures every kernel
        self.restore(snap)
        key, build = ("rows", T, True), (lambda: self._rows_launches(T, True))
        out = []
        for _ in range(reps):
            self._put_rows(ids)
            out.append(e.replay_ms(lambda: self.graphs.run(key, build), replays))
            self.restore(snap)
        return out

    def _verify_rows(self, ids: np.ndarray, want_logits: bool) -> Rows:
        """Rows of a verify; their `hidden` is a device array (the loop only slices it and
        hands it to mtp_draft / mtp_feed), valid until the next verify."""
        self._run_rows(ids, head=True)
        T = ids.size
        hidden = self.hidden_rows[:T]
        hidden.copy_to_device(self.wsv.x[:T], stream=self.engine.stream)
        return self.head.rows(self.engine, T, hidden, want_logits)

    def verify(self, ids, want_logits: bool = False) -> Rows:
        """[x, d_1 .. d_K] in one forward (T = K+1): a row per position."""
        e = self.engine
        ids = np.asarray(ids, np.int32).reshape(-1)
        if not 1 <= ids.size <= LOGIT_ROWS:
            raise ValueError(f"verify takes 1..{LOGIT_ROWS} tokens (K <= {MAX_SPEC_K}), got {ids.size}")
        if self.rollback == "recompute" and e.rs is not None:
            e.rs.snapshot(into=self._before_verify, stream=e.stream)
        self._pending = (e.position, ids)
        return self._verify_rows(ids, want_logits)

    def commit(self, n: int) -> None:
        """Keep the first n verified tokens: KV rows past them are dead by position; the
        recurrent state is rolled back (module doc)."""
        if self._pending is None:
            raise RuntimeError("commit() without a verify() before it")
        (start, ids), self._pending = self._pending, None
        if not 1 <= n <= ids.size:
            raise ValueError(f"commit({n}) after verifying {ids.size} tokens")
        if n == ids.size:
            return
        e = self.engine
        if e.rs is None:                                 # attention-only models just truncate
            self.engine.set_position(start + n)
        elif self.rollback == "recompute":
            e.rs.restore(self._before_verify, stream=e.stream)
            self.engine.set_position(start)
            self._run_rows(ids[:n], head=False)
        else:                                            # "states": the kernels kept them
            e.rs.restore_step(self.wsv.step_states, n - 1, stream=e.stream)
            self.engine.set_position(start + n)
        e.stream.synchronize()

    # ------------------------------------------------------------------ snapshots

    def snapshot(self) -> EngineSnapshot:
        """A copy of the recurrent state (allocated here: the live test drafters' decode-ahead
        path, not the speculative loop's) plus the lengths."""
        e = self.engine
        states = e.rs.snapshot(stream=e.stream) if e.rs is not None else None
        return EngineSnapshot(self._sequence, len(self._rewinds), e.position, self.mtp_position,
                              states)

    def restore(self, snap: EngineSnapshot) -> None:
        """Back to `snap` (same validity rules as ReferenceModel.restore: same sequence, no
        rewind below it since, the MTP head not truncated below its length)."""
        e = self.engine
        if snap.sequence != self._sequence:
            raise ValueError("snapshot is from an earlier sequence (the target was reset since)")
        if snap.position > e.position or any(p < snap.position for p in self._rewinds[snap.n_rewinds:]):
            raise ValueError(f"snapshot at position {snap.position} is stale: the sequence was "
                             f"rewound below it since it was taken")
        if self.mtp is not None:
            if self.mtp.position < snap.mtp_position:
                raise ValueError(f"snapshot's MTP length {snap.mtp_position} > the head's "
                                 f"{self.mtp.position}: the head was truncated since")
            self.mtp.position = snap.mtp_position
        if snap.states is not None:
            e.rs.restore(snap.states, stream=e.stream)
        if snap.position < e.position:
            self._rewinds.append(snap.position)
        self.engine.set_position(snap.position)
        self._pending = None
        e.stream.synchronize()

    # ------------------------------------------------------------------ the MTP head

    def _need_mtp(self) -> GpuMTPHead:
        if self.mtp is None:
            raise UnsupportedArchitecture(
                f"{self.name}: this checkpoint has no MTP head (nextn tensors); use "
                f"--draft-mode oracle/adversarial/mixed, or a Qwen3.5/3.6 checkpoint with MTP")
        return self.mtp

    @property
    def mtp_position(self) -> int:
        return 0 if self.mtp is None else self.mtp.position

    def mtp_truncate(self, n: int) -> None:
        """Keep n pairs: the head's KV rows past n are dead by position."""
        head = self._need_mtp()
        if not 0 <= n <= head.position:
            raise ValueError(f"mtp_truncate({n}) with {head.position} pairs fed")
        head.position = n

    def mtp_feed(self, hidden, tokens, vocab=None, want_logits: bool = False) -> Rows:
        return self._need_mtp().feed(hidden, tokens, vocab, want_logits)

    def mtp_draft(self, chunks, k: int, vocab=None, probs: bool = False):
        """k greedy drafts after feeding the true pairs `chunks` (spec.MTPDrafter's fast path:
        the draft chain runs as captured graphs, GpuMTPHead.draft); with `probs`, (drafts,
        their top probabilities) -- confidence gating without the logits on the host."""
        return self._need_mtp().draft(chunks, k, vocab, probs)


__all__ = ["EngineSnapshot", "EngineSpecTarget", "GpuMTPHead", "LOGIT_ROWS"]
