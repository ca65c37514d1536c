"""Instruction counts of a kernel's SASS, with no GPU: what a change does to a loop, before the
device says what it does to the time.

    python3 bench/sass_count.py bw24nb.kernels.matvec_q4k:matvec_q8_q4_k_v4 \
        bw24nb.kernels.matvec_q4k:matvec_q8_q4_k_v4_r4 [--cc 9.0] [--jsonl F] [--show-sass]

Each KERNEL is module:attribute, a kernel the module lists in PTX_SIGNATURES (its first
signature is compiled). The PTX comes from numba (bw24nb.ptx.offline), the cubin from the ptxas
on PATH (closest to the device driver's JIT; --assembler nvjitlink for the NVVM's own toolkit,
whose SASS can differ), the SASS from `cuobjdump -sass` (on PATH, or the pip wheel:
`pip install -e ".[sass]"`). Printed per kernel: registers and spills (from the cubin's
resource usage), all instructions, and the main loop (for the decode matvecs one step of the
row loop) with its opcode mix, and the inner loop when it is shorter.
The main loop is the backward-branch span holding the most work (dp4a, MMA, float multiplies,
loads); the inner loop the shortest span holding all of its dp4a / MMA (the chunk loop of a
kernel whose row loop holds it). A rows kernel's loop covers rows x slots (row, unit) pairs:
divide by both to compare.
Records (date, commit, kernel, cc, counts) go to --jsonl (research/tune-data/sass.jsonl).
Static counts are not times: issue-bound kernels follow them, memory-bound ones need not.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))      # after PYTHONPATH: another tree (an old commit) may come first
sys.path.append(str(ROOT / "bench"))

_INSN = re.compile(r"^\s+/\*([0-9a-f]+)\*/\s+(.*?)\s*;")
_WORK = {"IDP", "IMMA", "HMMA", "FFMA", "FMUL", "LDG"}
_DOTS = {"IDP", "IMMA", "HMMA"}


def cuobjdump() -> str:
    """Path of cuobjdump: PATH first, then the nvidia-cuda-cuobjdump wheel."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import nvidia
        for base in nvidia.__path__:
            for cand in Path(base).glob("cu*/bin/cuobjdump"):
                return str(cand)
    except ImportError:
        pass
    sys.exit("sass_count: no cuobjdump (pip install -e \".[sass]\", or put CUDA's bin on PATH)")


def sass_of(cubin: bytes) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        out = subprocess.run([cuobjdump(), "-sass", "-res-usage", str(path)], capture_output=True,
                             text=True, check=True)
    return out.stdout


def _opcode(text: str) -> str:
    text = re.sub(r"^@!?U?P\w+\s+", "", text)          # a predicate guard
    return text.split()[0].split(".")[0]


def _functions(sass: str) -> dict[str, list[str]]:
    """cuobjdump's SASS split by function: {name: its lines}."""
    funcs, name = {}, None
    for line in sass.splitlines():
        m = re.match(r"\s+Function : (\S+)", line)
        if m:
            name = m.group(1)
            funcs[name] = []
        elif name:
            funcs[name].append(line)
    return funcs


def count(sass: str) -> dict:
    """{total, loop, loop_ops, registers, stack_bytes} of the kernel in cuobjdump's output (the
    largest function; helpers such as __cuda_sm20_div_s64 are left out)."""
    funcs = _functions(sass)
    name = max(funcs, key=lambda k: len(funcs[k]))
    ins = [(int(m.group(1), 16), m.group(2)) for m in map(_INSN.match, funcs[name]) if m]
    # the main loop: of the spans closed by a backward branch, the one holding the most work
    # (integer dots, tensor-core ops, float multiplies and loads), then the shortest
    spans = []
    for addr, text in ins:
        m = re.search(r"BRA\s+(0x[0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            spans.append([t for a, t in ins if int(m.group(1), 16) <= a <= addr])
    body = max(spans, key=lambda sp: (sum(_opcode(t) in _WORK for t in sp), -len(sp)),
               default=[])
    # the inner loop: the shortest span holding all of the main loop's dots (a kernel whose
    # rows loop holds its chunk loop counts the chunk loop here)
    dots = lambda sp: sum(_opcode(t) in _DOTS for t in sp)      # noqa: E731
    inner = min((sp for sp in spans if dots(sp) == dots(body)), key=len, default=body)
    usage = re.search(r"Function " + re.escape(name) + r":\s*\n\s*REG:(\d+) STACK:(\d+)", sass)
    return dict(total=len(ins), loop=len(body),
                loop_ops=dict(collections.Counter(map(_opcode, body)).most_common()),
                inner=len(inner),
                inner_ops=dict(collections.Counter(map(_opcode, inner)).most_common()),
                registers=int(usage.group(1)) if usage else None,
                stack_bytes=int(usage.group(2)) if usage else None)


def _ptxas_cubin(ptx: str, arch: str, maxrreg: int | None = None) -> tuple[bytes | None, str]:
    """(cubin, how) from the ptxas on PATH -- the assembler closest to the driver's JIT, which
    is what runs on the device (its CUDA 13.0 driver) -- or (None, why not). A PTX newer than
    that ptxas takes (the pip NVVM's) is retried with its .version lowered to 9.0, CUDA
    13.0's ISA: the kernels use nothing newer, and the record says so. maxrreg: the kernel's
    own register cap (its `max_registers` option, which numba hands the linker, not the PTX)."""
    exe = shutil.which("ptxas")
    if not exe:
        return None, "no ptxas on PATH"
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        for text, how in ((ptx, "ptxas"), (re.sub(r"^\.version \d+\.\d+", ".version 9.0", ptx,
                                                  flags=re.M), "ptxas, PTX .version 9.0")):
            src.write_text(text)
            cap = [] if maxrreg is None else [f"-maxrregcount={maxrreg}"]
            proc = subprocess.run([exe, f"-arch={arch}", *cap, str(src), "-o", str(out)],
                                  capture_output=True, text=True)
            if proc.returncode == 0:
                return out.read_bytes(), how
        return None, proc.stderr.strip()


def kernel_sass(spec: str, cc: tuple[int, int], assembler: str) -> tuple[str, str]:
    """(SASS text, which assembler made it) of kernel `spec` at compute capability cc."""
    from bw24nb.ptx.offline import allow_compiling_without_gpu, compile_ptx, link_ptx
    allow_compiling_without_gpu()
    mod_name, _, attr = spec.partition(":")
    mod = importlib.import_module(mod_name)
    sig = mod.PTX_SIGNATURES[attr][0]
    ptx = compile_ptx(getattr(mod, attr), sig, cc)
    arch = f"sm_{cc[0]}{cc[1]}"
    links = getattr(mod, "LINKS", {}).get(attr, [])
    if assembler == "ptxas" and not links:
        maxrreg = getattr(getattr(mod, attr), "targetoptions", {}).get("max_registers")
        cubin, how = _ptxas_cubin(ptx, arch, maxrreg)
        if cubin is not None:
            return sass_of(cubin), how
        sys.exit(f"sass_count: ptxas could not assemble {spec}: {how}")
    texts = [ptx] + [(ROOT / "bw24nb" / "ptx" / f).read_text() for f in links]
    cubin, err = link_ptx(texts, arch)
    if cubin is None:
        sys.exit(f"sass_count: {spec} did not assemble: {err}")
    return sass_of(cubin), "nvJitLink"


def _commit() -> str:
    from matvec_bench import _commit as commit      # git HEAD of the tree it runs in
    return commit()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("kernels", nargs="+", help="module:attribute, e.g. "
                    "bw24nb.kernels.matvec_q4k:matvec_q8_q4_k_v4")
    ap.add_argument("--cc", default="9.0", help="compute capability, e.g. 9.0 or 12.0")
    ap.add_argument("--jsonl", default=None, help="append one record per kernel here")
    ap.add_argument("--commit", default=None)
    ap.add_argument("--show-sass", action="store_true", help="print the kernel's SASS")
    ap.add_argument("--assembler", choices=("ptxas", "nvjitlink"), default="ptxas",
                    help="ptxas on PATH (closest to the device driver's JIT; default) or "
                         "nvJitLink (the NVVM's own toolkit version; its SASS may differ)")
    args = ap.parse_args()
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        sys.exit("sass_count: unset NUMBA_ENABLE_CUDASIM (the simulator cannot compile PTX)")
    cc = tuple(int(v) for v in args.cc.split("."))
    commit = args.commit or _commit()
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    for spec in args.kernels:
        sass, how = kernel_sass(spec, cc, args.assembler)
        c = count(sass)
        mix = " ".join(f"{k}:{v}" for k, v in list(c["loop_ops"].items())[:14])
        print(f"{spec}  sm_{cc[0]}{cc[1]} ({how}): {c['registers']} registers, stack {c['stack_bytes']} B, "
              f"{c['total']} instructions, main loop {c['loop']}: {mix}"
              + ("" if c["inner"] == c["loop"] else f"; inner loop {c['inner']}"))
        if args.show_sass:
            print(sass)
        if args.jsonl:
            with open(args.jsonl, "a") as f:
                f.write(json.dumps(dict(date=date, gpu=f"sm_{cc[0]}{cc[1]} (static, no GPU)",
                                        assembler=how, commit=commit, kernel=spec,
                                        metric="sass_main_loop_instructions", value=c["loop"],
                                        **c)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
