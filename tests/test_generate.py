"""The generation loop: EOS, max_tokens, stop strings cut exactly, cancel, the argmax gate.

A table-driven toy backend (next token = f(current token)) and a one-character-per-token
vocabulary make every expected output computable by hand.
"""
import threading

import numpy as np
import pytest

from bw24nb.errors import ContextOverflow
from bw24nb.generate import GenerationStats, _held_back, argmax_gate, generate
from bw24nb.sampling import SamplingParams, sample_with_uniform

VOCAB = list("abcdefgh") + ["<eos>"]
EOS = len(VOCAB) - 1


class CharTokenizer:
    eos_ids = {EOS}

    def encode(self, text):
        return [VOCAB.index(c) for c in text]

    def stream_decoder(self):
        class D:
            def push(self, t):
                return VOCAB[t]

            def flush(self):
                return ""
        return D()


class TableBackend:
    """Logits one-hot on NEXT[last token]; counts calls so tests can see the work done."""
    name = "table"

    def __init__(self, nxt, n_ctx=64):
        self.nxt, self.n_ctx, self.decodes = nxt, n_ctx, 0

    def _logits(self, t):
        z = np.zeros(len(VOCAB), np.float32)
        z[self.nxt[t]] = 5.0
        return z

    def reset(self):
        pass

    def prefill(self, ids):
        return self._logits(ids[-1])

    def decode(self, t):
        self.decodes += 1
        return self._logits(t)


CYCLE = {i: (i + 1) % 8 for i in range(8)}          # a->b->c ... h->a, never EOS
TO_EOS = {0: 1, 1: 2, 2: EOS}                          # a->b->c->EOS


def run(backend, prompt, n, stop=(), cancel=None):
    st = GenerationStats()
    text = "".join(generate(backend, CharTokenizer(), CharTokenizer().encode(prompt), n,
                            SamplingParams(), stop=stop, cancel=cancel, stats=st))
    return text, st


def test_max_tokens_and_length_reason():
    text, st = run(TableBackend(CYCLE), "a", 5)
    assert text == "bcdef" and st.finish_reason == "length" and st.completion_tokens == 5


def test_eos_stops_without_emitting_it():
    text, st = run(TableBackend(TO_EOS), "a", 50)
    assert text == "bc" and st.finish_reason == "stop" and st.token_ids == [1, 2]


def test_stop_string_cut_exactly_across_tokens():
    text, st = run(TableBackend(CYCLE), "a", 50, stop=("efg",))
    assert text == "bcd" and st.finish_reason == "stop"
    text, _ = run(TableBackend(CYCLE), "a", 50, stop=("zz", "cd"))
    assert text == "b"


def test_partial_stop_is_released_at_length():
    # "de" could begin the stop "def" only if generation continued; at max_tokens it is text
    text, st = run(TableBackend(CYCLE), "a", 4, stop=("def",))
    assert text == "bcde" and st.finish_reason == "length"


def test_held_back():
    assert _held_back("abcde", ("def",)) == 2
    assert _held_back("abc", ("xyz",)) == 0
    assert _held_back("aab", ("abx", "b")) == 2


def test_context_limit():
    with pytest.raises(ContextOverflow, match="context holds 4"):
        run(TableBackend(CYCLE, n_ctx=4), "abcd", 3)
    text, st = run(TableBackend(CYCLE, n_ctx=6), "abc", 50)
    assert st.finish_reason == "length" and len(text) == 3   # positions 3,4,5 fill the context


def test_cancel_stops_between_tokens():
    ev = threading.Event()
    ev.set()
    text, st = run(TableBackend(CYCLE), "a", 50, cancel=ev)
    assert text == "" and st.finish_reason == "cancelled"


def test_argmax_gate_detects_disagreement():
    class Skewed(TableBackend):
        def prefill(self, ids):
            return self._logits(ids[-1]) if len(ids) == 1 else self._logits((ids[-1] + 3) % 8)
    assert argmax_gate(TableBackend(CYCLE), [0, 1, 2])[0]
    ok, a, b = argmax_gate(Skewed(CYCLE), [0, 1, 2])
    assert not ok and (a, b) == (6, 3)   # prefill saw token 5 -> 6; decode saw 2 -> 3


def test_sampling_rule_by_hand():
    logits = np.log(np.array([0.1, 0.4, 0.2, 0.3]))
    p = SamplingParams(temperature=1.0)
    # sorted by prob: ids 1 (.4), 3 (.3), 2 (.2), 0 (.1); cumulative .4 .7 .9 1.0
    assert [sample_with_uniform(logits, p, u) for u in (0.0, 0.39, 0.41, 0.75, 0.95)] == [1, 1, 3, 2, 0]
    top2 = SamplingParams(temperature=1.0, top_k=2)    # renormalised over {1: 4/7, 3: 3/7}
    assert sample_with_uniform(logits, top2, 0.56) == 1 and sample_with_uniform(logits, top2, 0.58) == 3
    nucleus = SamplingParams(temperature=1.0, top_p=0.65)   # smallest prefix with mass >= .65: {1, 3}
    assert sample_with_uniform(logits, nucleus, 0.99) == 3
    assert sample_with_uniform(logits, SamplingParams(), 0.99) == 1    # greedy
