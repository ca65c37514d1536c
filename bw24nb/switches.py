"""Module switches set for a block of code.

The engine's kernel choices are module attributes (matvec.ROWS_PAIRS, engine.STACK_GATE_UP_ROWS,
...), each a default chosen by measurement with its older forms kept for side-by-side runs.
The benchmarks (bench/run_bench.py's --launch modes) and kernel-check's twins set them for one
block and must restore them even when the block fails, or a later measurement runs the wrong
kernel.
"""
from __future__ import annotations

import contextlib
import importlib


@contextlib.contextmanager
def switched(settings):
    """Module attributes set for the block, restored after it (error or not): settings is
    [(module or module name, attribute, value)], set in order and restored in reverse."""
    saved = []
    try:
        for mod, attr, value in settings:
            m = importlib.import_module(mod) if isinstance(mod, str) else mod
            saved.append((m, attr, getattr(m, attr)))
            setattr(m, attr, value)
        yield
    finally:
        for m, attr, value in reversed(saved):
            setattr(m, attr, value)
