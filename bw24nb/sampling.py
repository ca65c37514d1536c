"""Host-side token sampling (the numpy reference path; the GPU engine samples on device).

One algorithm, written once, so that the device kernel (kernels/sampling.py) can be checked
against it token for token given the same uniform random number:
  1. temperature == 0  -> argmax (ties -> lowest id)
  2. logits / temperature, keep the top_k largest (k <= 0: all), softmax in float64
  3. sort kept tokens by probability (descending, ties by id), keep the smallest prefix whose
     mass reaches top_p (always at least one token), renormalise
  4. pick with one uniform u in [0, 1): the first token whose cumulative mass exceeds u * total
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def validate(self):
        if not (self.temperature >= 0.0 and np.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        return self


def argmax(logits: np.ndarray) -> int:
    return int(np.argmax(logits))  # numpy returns the first (lowest) index among ties


def sample_with_uniform(logits: np.ndarray, params: SamplingParams, u: float) -> int:
    """The sampling rule above with an explicit uniform draw u in [0, 1)."""
    if params.temperature == 0.0:
        return argmax(logits)
    z = np.asarray(logits, dtype=np.float64) / params.temperature
    order = np.lexsort((np.arange(z.size), -z))          # by value desc, then id asc
    if params.top_k > 0:
        order = order[: params.top_k]
    kept = z[order]
    p = np.exp(kept - kept[0])
    p /= p.sum()
    if params.top_p < 1.0:
        cum = np.cumsum(p)
        n = int(np.searchsorted(cum, params.top_p, side="left")) + 1
        order, p = order[:n], p[:n]
    cum = np.cumsum(p)
    i = int(np.searchsorted(cum, u * cum[-1], side="right"))
    return int(order[min(i, order.size - 1)])


class Sampler:
    """Seeded sampler: the same seed and logits give the same tokens."""

    def __init__(self, params: SamplingParams):
        self.params = params.validate()
        self._rng = np.random.default_rng(params.seed)

    def __call__(self, logits: np.ndarray) -> int:
        if self.params.temperature == 0.0:
            return argmax(logits)
        return sample_with_uniform(logits, self.params, float(self._rng.random()))
