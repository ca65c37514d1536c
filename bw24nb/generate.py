"""The generation loop shared by `bw24nb gen` and the server.

A backend is anything with `reset()`, `prefill(ids) -> logits of the last position` and
`decode(id) -> logits`: the numpy reference (CPU) or the GPU engine. The loop samples, detects
end-of-sequence and stop strings (cut exactly: text that might be the start of a stop string is
held back until it is known not to be), and honours a cancel flag between tokens.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Iterator, Protocol

import numpy as np

from .errors import ContextOverflow
from .sampling import Sampler, SamplingParams


class Backend(Protocol):
    name: str            # printed on the one line that says which path runs
    n_ctx: int

    def reset(self) -> None: ...
    def prefill(self, ids: list[int]) -> np.ndarray: ...
    def decode(self, token: int) -> np.ndarray: ...


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    finish_reason: str | None = None      # "stop" | "length" | "cancelled"
    token_ids: list[int] = field(default_factory=list)

    @property
    def prefill_tps(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tps(self) -> float:
        # the first generated token comes from prefill's logits; decode made the rest
        n = max(self.completion_tokens - 1, 0)
        return n / self.decode_s if self.decode_s > 0 else 0.0


def _held_back(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best


def generate(backend: Backend, tokenizer, prompt_ids: list[int], max_tokens: int,
             sampling: SamplingParams = SamplingParams(), stop: tuple[str, ...] = (),
             cancel: threading.Event | None = None,
             stats: GenerationStats | None = None) -> Iterator[str]:
    """Yield text pieces as they become final; fill `stats` (finish_reason etc.) as it goes."""
    stats = stats if stats is not None else GenerationStats()
    if not prompt_ids:
        raise ValueError("the prompt is empty")
    if len(prompt_ids) >= backend.n_ctx:
        raise ContextOverflow(
            f"the prompt has {len(prompt_ids)} tokens but the context holds {backend.n_ctx}; "
            f"shorten the prompt or raise --ctx")
    sampler = Sampler(sampling)
    stops = tuple(s for s in stop if s)
    stats.prompt_tokens = len(prompt_ids)

    backend.reset()
    t0 = time.perf_counter()
    logits = backend.prefill(list(prompt_ids))
    stats.prefill_s = time.perf_counter() - t0

    decoder = tokenizer.stream_decoder()
    pending = ""                 # decoded text not yet emitted (might begin a stop string)
    n_pos = len(prompt_ids)
    t_dec = time.perf_counter()
    while True:
        if cancel is not None and cancel.is_set():
            stats.finish_reason = "cancelled"
            break
        token = sampler(logits)
        if token in tokenizer.eos_ids:
            stats.finish_reason = "stop"
            break
        stats.token_ids.append(token)
        stats.completion_tokens += 1
        pending += decoder.push(token)
        cut = min((i for i in (pending.find(s) for s in stops) if i >= 0), default=-1)
        if cut >= 0:
            if cut:
                yield pending[:cut]
            pending = ""
            stats.finish_reason = "stop"
            break
        keep = _held_back(pending, stops)
        if len(pending) > keep:
            yield pending[: len(pending) - keep]
            pending = pending[len(pending) - keep:]
        if stats.completion_tokens >= max_tokens or n_pos + 1 >= backend.n_ctx:
            stats.finish_reason = "length"
            break
        logits = backend.decode(token)
        n_pos += 1
    stats.decode_s = time.perf_counter() - t_dec
    if stats.finish_reason != "stop" or not stops:
        pending += decoder.flush()
    if pending and stats.finish_reason != "cancelled":
        yield pending


def argmax_gate(backend: Backend, prompt_ids: list[int]) -> tuple[bool, int, int]:
    """Prefill's next-token argmax vs decoding the same prompt one token at a time.

    Returns (match, prefill_argmax, decode_argmax). Leaves the backend reset.
    """
    backend.reset()
    a = int(np.argmax(backend.prefill(list(prompt_ids))))
    backend.reset()
    logits = backend.prefill([prompt_ids[0]])
    for t in prompt_ids[1:]:
        logits = backend.decode(t)
    b = int(np.argmax(logits))
    backend.reset()
    return a == b, a, b
