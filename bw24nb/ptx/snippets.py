"""Read the hand-written PTX files of this package into inline-asm templates.

Each ``*.ptx`` file beside this module is a complete, linkable PTX module (so the same code can be
bound with ``cuda.declare_device(..., link=[path])``) in which the instruction sequence that
matters sits between two marker comments::

    // @inline dp4a_s32: =r %d0, r %a0, r %b0, r %c0
    dp4a.s32.s32 %d0, %a0, %b0, %c0;
    // @end

The header names the snippet and lists its operands in order: outputs first (constraint with a
leading ``=``), then inputs, each as ``<llvm constraint> <ptx register>``. Turning the block into
an LLVM inline-asm template only renames those registers to ``$0, $1, ...``; everything else
(including temporaries declared inside ``{ }``, which must be named ``%bw_*`` so they can never
shadow a register NVVM allocates) is copied verbatim. So the inline-asm binding and the linked
``.func`` run the very same lines, and editing the ``.ptx`` file changes both.

Pure Python: no numba import, so tests and the compile check can inspect snippets anywhere.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

PTX_DIR = Path(__file__).resolve().parent

# LLVM NVPTX inline-asm constraint letters we use: r = 32-bit, l = 64-bit, h = 16-bit, f = f32.
_CONSTRAINTS = {"r", "l", "h", "f"}
_HEADER = re.compile(r"^\s*//\s*@inline\s+(?P<name>\w+)\s*:\s*(?P<ops>.*?)\s*$")
_END = re.compile(r"^\s*//\s*@end\s*$")
_OPERAND = re.compile(r"^(?P<out>=?)(?P<c>[a-z])\s+(?P<reg>%\w+)$")
# PTX's read-only special registers a block may read by name (timers.ptx, cluster.ptx): no NVVM
# register can shadow them
_SPECIAL_REGISTERS = {"%clock", "%clock64", "%globaltimer", "%cluster_ctarank", "%cluster_nctarank"}


class SnippetError(ValueError):
    """A .ptx file's @inline block is malformed; the message names the file and line."""


@dataclass(frozen=True)
class Operand:
    constraint: str   # "r", "l", "h" or "f" (without the "=" of outputs)
    register: str     # the PTX register name used in the block, e.g. "%a0"
    is_output: bool


@dataclass(frozen=True)
class Snippet:
    """One ``// @inline`` block of a .ptx file."""
    name: str
    path: Path
    operands: tuple[Operand, ...]
    body: tuple[str, ...]          # the block's lines, stripped, comments kept out

    @property
    def outputs(self) -> tuple[Operand, ...]:
        return tuple(o for o in self.operands if o.is_output)

    @property
    def inputs(self) -> tuple[Operand, ...]:
        return tuple(o for o in self.operands if not o.is_output)

    @property
    def constraints(self) -> str:
        """The LLVM constraint string, outputs then inputs: ``"=r,r,r,r"``."""
        return ",".join(("=" if o.is_output else "") + o.constraint for o in self.operands)

    @property
    def asm_template(self) -> str:
        """The block with its operand registers renamed to ``$0, $1, ...``."""
        index = {o.register: i for i, o in enumerate(self.operands)}

        def rename(match: re.Match) -> str:
            reg = match.group(0)
            return f"${index[reg]}" if reg in index else reg

        return "\n\t".join(re.sub(r"%\w+", rename, line) for line in self.body)

    @property
    def opcodes(self) -> tuple[str, ...]:
        """The instruction mnemonics of the block (``dp4a.s32.s32``), for checking emitted PTX."""
        ops = []
        for line in self.body:
            word = line.split()[0].rstrip(";") if line.split() else ""
            if word and not word.startswith((".", "{", "}")):
                ops.append(word)
        return tuple(ops)


def _parse_operands(text: str, where: str) -> tuple[Operand, ...]:
    """The header's operand list; empty for an instruction without operands (a barrier)."""
    operands = []
    items = [s.strip() for s in text.split(",")] if text.strip() else []
    for item in items:
        m = _OPERAND.match(item)
        if m is None or m.group("c") not in _CONSTRAINTS:
            raise SnippetError(f"{where}: operand {item!r} is not '<[=]constraint> %register' "
                               f"with constraint in {sorted(_CONSTRAINTS)}")
        operands.append(Operand(m.group("c"), m.group("reg"), m.group("out") == "="))
    seen_input = False
    for o in operands:
        seen_input |= not o.is_output
        if o.is_output and seen_input:
            raise SnippetError(f"{where}: outputs must come before inputs")
    if len({o.register for o in operands}) != len(operands):
        raise SnippetError(f"{where}: an operand register is listed twice")
    return tuple(operands)


def parse_snippets(path: Path) -> dict[str, Snippet]:
    """All ``@inline`` blocks of one .ptx file, by name."""
    path = Path(path)
    found: dict[str, Snippet] = {}
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = _HEADER.match(lines[i])
        if m is None:
            if _END.match(lines[i]):
                raise SnippetError(f"{path}:{i + 1}: '// @end' without '// @inline'")
            i += 1
            continue
        where = f"{path}:{i + 1}"
        operands = _parse_operands(m.group("ops"), where)
        body = []
        i += 1
        while i < len(lines) and not _END.match(lines[i]):
            line = lines[i].split("//", 1)[0].strip()
            if _HEADER.match(lines[i]):
                raise SnippetError(f"{where}: nested '// @inline'")
            if line:
                body.append(line)
            i += 1
        if i == len(lines):
            raise SnippetError(f"{where}: '// @inline {m.group('name')}' has no '// @end'")
        if not body:
            raise SnippetError(f"{where}: empty block")
        text = "\n".join(body)
        if "$" in text:
            raise SnippetError(f"{where}: '$' is the inline-asm operand marker; not allowed in a block")
        used = set(re.findall(r"%\w+", text))
        for o in operands:
            if o.register not in used:
                raise SnippetError(f"{where}: operand {o.register} is not used in the block")
        for reg in used - {o.register for o in operands} - _SPECIAL_REGISTERS:
            if not reg.startswith("%bw_"):
                raise SnippetError(f"{where}: register {reg} is neither an operand nor a '%bw_' "
                                   "temporary (declared inside the block's {{ }})")
        name = m.group("name")
        if name in found:
            raise SnippetError(f"{where}: second block named {name!r}")
        found[name] = Snippet(name, path, operands, tuple(body))
        i += 1
    return found


@lru_cache(maxsize=None)
def all_snippets() -> dict[str, Snippet]:
    """Every block of every .ptx file in this package, by (package-unique) name."""
    out: dict[str, Snippet] = {}
    for path in sorted(PTX_DIR.glob("*.ptx")):
        for name, snip in parse_snippets(path).items():
            if name in out:
                raise SnippetError(f"snippet {name!r} defined in {out[name].path} and {path}")
            out[name] = snip
    return out


def snippet(name: str) -> Snippet:
    try:
        return all_snippets()[name]
    except KeyError:
        raise SnippetError(f"no '// @inline {name}' block in {PTX_DIR}/*.ptx") from None


def ptx_path(filename: str) -> str:
    """Absolute path of one of this package's .ptx files (for ``link=[...]``)."""
    path = PTX_DIR / filename
    if not path.is_file():
        raise FileNotFoundError(path)
    return str(path)
