"""Chat templates: the model's own Jinja template, rendered the way HF transformers renders it.

A chat model ships its prompt format as a Jinja template (GGUF key `tokenizer.chat_template`,
or `chat_template.jinja` / `tokenizer_config.json` in an HF directory). The prompt the model
was trained on is whatever transformers' `apply_chat_template` renders from it, so we render
with the same environment: an `ImmutableSandboxedEnvironment` (templates are untrusted code
from the Hub) with `trim_blocks` and `lstrip_blocks`, the `loopcontrols` extension, a
`{% generation %}` block tag (transformers uses it to mark assistant tokens; here it just
renders its body), and the globals/filters templates rely on:

    raise_exception(msg)   abort with the template's own message (e.g. "roles must alternate")
    tojson(x, ...)         json.dumps without HTML escaping, non-ASCII kept (ensure_ascii=False)
    strftime_now(fmt)      today's date, for templates that print "Today is ..."
    namespace, dict        the mutable scratch objects templates use inside loops

Variables: `messages`, `add_generation_prompt`, `tools`, `documents`, the special-token
strings (`bos_token`, `eos_token`, `pad_token`, `unk_token` where the model has them) and any
extra keyword (e.g. `enable_thinking=False` for Qwen3).
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache

from .errors import Bw24Error


class ChatTemplateError(Bw24Error):
    """The model has no chat template, the template does not compile, or it refused the
    conversation (its own `raise_exception`)."""


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Jinja's built-in tojson HTML-escapes '<', '>', '&' and "'" (meant for <script> tags);
    # a prompt must show the model the JSON exactly as transformers would.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _raise_exception(message):
    import jinja2
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def _compile(source: str):
    """Compile once per distinct template string (a server renders the same one per request)."""
    import jinja2
    import jinja2.ext
    from jinja2 import nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(jinja2.ext.Extension):
        # `{% generation %}...{% endgeneration %}` marks the assistant's tokens for training
        # masks in transformers; for inference the body renders as plain text.
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

        def _render_body(self, caller):
            return caller()

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = dict
    return env.from_string(source)


def _plain(value, where: str):
    """A copy of `value` made of JSON types only: the template sees data, never objects whose
    methods the sandbox does not know about (and the caller's messages are never mutated)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    # Subclasses (enums, str subclasses) become their base type; numpy scalars their Python one.
    for base in (bool, str, int, float):
        if isinstance(value, base):
            return str.__str__(value) if base is str else base(value)
    if hasattr(value, "item") and hasattr(value, "dtype") and getattr(value, "ndim", None) == 0:
        return _plain(value.item(), where)
    if isinstance(value, Mapping):
        return {str(k): _plain(v, where) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, where) for v in value]
    raise TypeError(f"{where} holds a {type(value).__name__}; chat messages, tools and template "
                    f"arguments must be JSON-like (dict, list, str, int, float, bool, None)")


class ChatTemplate:
    """A compiled chat template plus the special-token strings it may reference."""

    def __init__(self, source: str, special_tokens: Mapping[str, str] | None = None):
        if not isinstance(source, str) or not source.strip():
            raise ChatTemplateError("the chat template is empty")
        self.source = source
        self.special_tokens = dict(special_tokens or {})
        try:
            self._template = _compile(source)
        except Exception as e:  # jinja2.TemplateSyntaxError and friends
            raise ChatTemplateError(f"the model's chat template does not compile: {e}") from e

    def render(self, messages, add_generation_prompt: bool = True, tools=None, documents=None,
               **kwargs) -> str:
        """The prompt text for `messages` ([{"role": ..., "content": ...}, ...]).

        Keys whose value is None are dropped from each message first (OpenAI clients send
        `content: null` next to `tool_calls`; templates handle a missing key, not a None).
        Keyword arguments override the special-token strings, as in transformers.
        """
        if isinstance(messages, Mapping) or not hasattr(messages, "__iter__"):
            raise TypeError("messages must be a list of {'role': ..., 'content': ...} dicts")
        chat = []
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping):
                raise TypeError(f"messages[{i}] is a {type(m).__name__}, not a dict with "
                                f"'role' and 'content'")
            chat.append({k: _plain(v, f"messages[{i}][{k!r}]") for k, v in m.items() if v is not None})
        variables = {**self.special_tokens, **_plain(kwargs, "a chat template argument")}
        import jinja2
        try:
            return self._template.render(messages=chat, add_generation_prompt=add_generation_prompt,
                                         tools=_plain(tools, "tools"),
                                         documents=_plain(documents, "documents"), **variables)
        except jinja2.exceptions.TemplateError as e:
            raise ChatTemplateError(f"the chat template rejected this conversation: {e}") from e


# A minimal Qwen-style ChatML template (no tools, no thinking): what Qwen2-era chat models
# render for plain conversations. For tokenizers built without a model (qwen_tokenizer_metadata)
# and for tests; a real model always brings its own.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
