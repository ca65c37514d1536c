"""Where a kernel's warps wait, from an Nsight Compute source page: the warp-state samples of
``ncu -i REPORT --page source --csv --print-source sass`` (bench/h200_session23.sh's ncu stage
writes one per target as ncu_TARGET_sass.csv) summed by stall reason, each with the opcodes
that held most of its samples, and the executed-instruction mix.

Usage: python3 bench/ncu_stalls.py FILE.csv [FILE.csv ...]
"""
from __future__ import annotations

import collections
import csv
import sys


def _opcode(source: str) -> str:
    words = source.split()
    if words and words[0].startswith("@"):          # a predicate
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def summary(path: str) -> str:
    rows = list(csv.reader(open(path, newline="")))
    if len(rows) < 3:
        return f"{path}: no instruction rows (not an ncu source page?)"
    header, data = rows[1], rows[2:]
    col = {name: i for i, name in enumerate(header)}
    for need in ("Source", "Warp Stall Sampling (All Samples)", "Instructions Executed"):
        if need not in col:
            return f"{path}: no column {need!r} (not an ncu source page of SASS?)"
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    total, by_op, executed, samples = collections.Counter(), {}, collections.Counter(), 0
    for r in data:
        if len(r) < len(header):
            continue
        op = _opcode(r[col["Source"]])
        samples += int(r[col["Warp Stall Sampling (All Samples)"]] or 0)
        executed[op] += int(r[col["Instructions Executed"]] or 0)
        for h in reasons:
            v = int(r[col[h]] or 0)
            total[h] += v
            by_op.setdefault(h, collections.Counter())[op] += v
    out = [f"{path}: {samples} samples"]
    for h, v in total.most_common(10):
        tops = ", ".join(f"{o} {100 * c / samples:.1f}" for o, c in by_op[h].most_common(4))
        out.append(f"  {h:24s} {100 * v / max(samples, 1):5.1f} %   ({tops})")
    n = sum(executed.values()) or 1
    out.append("  executed: " + ", ".join(f"{o} {100 * c / n:.1f} %"
                                          for o, c in executed.most_common(14)))
    return "\n".join(out)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    print("\n".join(summary(p) for p in sys.argv[1:]))
