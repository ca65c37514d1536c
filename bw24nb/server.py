"""The OpenAI-compatible HTTP server behind `bw24nb serve`.

One engine, one generation at a time. The engine (GPU or numpy reference) keeps state between
tokens and is not thread-safe, so exactly one thread ever touches it:

    HTTP handlers (asyncio, uvicorn's loop)                the engine thread (EngineWorker)
    ───────────────────────────────────────                ────────────────────────────────
    read the body, validate every field  → 4xx
    render the chat template, tokenize, check the context
    Job ─► bounded queue.Queue (full → 429) ─────────────► takes jobs in FIFO order
    await text pieces on an asyncio.Queue ◄─ call_soon_threadsafe ─ generate(...) yields pieces
    client gone → job.cancel.set() ──────────────────────► generate() stops between tokens

Everything a client can get wrong is checked before a job is queued, so a client mistake is
always a 4xx with OpenAI's error body {"error": {"message", "type", "param", "code"}} and never
reaches the engine. An engine failure is a 500 with a generic message (the traceback goes to
the server log, never into a response).

Why Starlette on uvicorn: Starlette is the small, well-kept ASGI toolkit FastAPI is built on.
It gives routing, a StreamingResponse that notices a client hanging up, and pure-ASGI
middleware, without pydantic models: bodies are validated by hand here because the error
bodies must have OpenAI's exact shape (FastAPI's automatic 422 bodies do not). uvicorn (h11)
is the reference ASGI server.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .errors import ContextOverflow
from .generate import GenerationStats, generate
from .sampling import SamplingParams

log = logging.getLogger("bw24nb.server")

MAX_BODY_BYTES = 32 * 2**20     # a prompt filling a 128k context is ~1 MB of text; 32 MB is ample
MAX_STOP_STRINGS = 4            # OpenAI's limit
CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


# --------------------------------------------------------------------------- errors

class APIError(Exception):
    """An error answered as OpenAI's JSON error body with an HTTP status."""

    TYPES = {400: "invalid_request_error", 401: "invalid_request_error",
             404: "invalid_request_error", 405: "invalid_request_error",
             413: "invalid_request_error", 429: "rate_limit_error",
             500: "server_error", 503: "server_error"}

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message,
                          "type": self.TYPES.get(self.status, "invalid_request_error"),
                          "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def _bad(message, param=None, code=None) -> APIError:
    return APIError(400, message, param=param, code=code)


def _engine_failure() -> APIError:
    return APIError(500, "The engine failed while generating; the server log has the details. "
                         "Retry, and report it if it persists.", code="internal_error")


# --------------------------------------------------------------------------- request parsing

@dataclass
class GenerationRequest:
    """A validated request: everything the engine thread needs, nothing it has to check."""
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _show(v) -> str:
    """A client's value, quoted back in an error message (briefly: it may be huge)."""
    text = json.dumps(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_text(s: str, where: str, param: str | None = None) -> str:
    # JSON may spell lone surrogates ("\ud800"): valid Python, not encodable text
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise _bad(f"'{where}' contains an unpaired UTF-16 surrogate; send valid Unicode text",
                   param or where) from None
    return s


# Optional fields: an explicit null means "not given", as OpenAI treats it.


def _opt_number(body, name, lo, hi, default):
    v = body.get(name)
    if v is None:
        return default
    if not _is_number(v) or not math.isfinite(v):
        raise _bad(f"'{name}' must be a number, got {_show(v)}", name)
    if not lo <= v <= hi:
        raise _bad(f"'{name}' must be between {lo} and {hi}, got {v}", name)
    return float(v)


def _opt_int(body, name, default=None):
    v = body.get(name)
    if v is None:
        return default
    if not _is_int(v):
        raise _bad(f"'{name}' must be an integer, got {_show(v)}", name)
    return v


def _opt_bool(body, name, default=False):
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise _bad(f"'{name}' must be true or false, got {_show(v)}", name)
    return v


# Parameters bw24nb understands but does not implement: accepted only at their neutral value,
# so a client never silently gets something other than what it asked for. Unknown fields are
# ignored (new client versions add optional fields faster than servers learn them).
_NEUTRAL = {
    "presence_penalty": (lambda v: _is_number(v) and v == 0, "0"),
    "frequency_penalty": (lambda v: _is_number(v) and v == 0, "0"),
    "logit_bias": (lambda v: v == {}, "{}"),
    "logprobs": (lambda v: v is False, "false"),
    "top_logprobs": (lambda v: _is_int(v) and v == 0, "0"),
    "echo": (lambda v: v is False, "false"),
    "best_of": (lambda v: _is_int(v) and v == 1, "1"),
    "suffix": (lambda v: v == "", '""'),
    "tools": (lambda v: v == [], "[]"),
    "functions": (lambda v: v == [], "[]"),
    "tool_choice": (lambda v: v == "none", '"none"'),
    "response_format": (lambda v: v == {"type": "text"}, '{"type": "text"}'),
}


def _parse_common(body, served_model: str) -> dict:
    """Fields shared by both endpoints, checked before any tokenization."""
    model = body.get("model")
    if model is None:
        raise _bad("'model' is required", "model")
    if not isinstance(model, str):
        raise _bad(f"'model' must be a string, got {_show(model)}", "model")
    if model != served_model:
        raise APIError(404, f"The model {_show(model)} does not exist; this server serves "
                            f"'{served_model}' (see GET /v1/models)",
                       param="model", code="model_not_found")
    n = _opt_int(body, "n", 1)
    if n != 1:
        raise _bad(f"'n' must be 1 (one engine, one sequence per request), got {n}", "n")
    for name, (is_neutral, neutral) in _NEUTRAL.items():
        v = body.get(name)
        if v is not None and not is_neutral(v):
            raise _bad(f"'{name}' is not supported by bw24nb; only {neutral} (or leaving it out) "
                       f"is accepted", name, "unsupported_parameter")

    temperature = _opt_number(body, "temperature", 0.0, 2.0, 1.0)
    top_p = _opt_number(body, "top_p", 0.0, 1.0, 1.0)
    top_k = _opt_int(body, "top_k", 0)          # extension (vLLM, llama.cpp): <= 0 means off
    seed = _opt_int(body, "seed")
    if top_p == 0.0:             # "keep only the most likely token": greedy, same tie rule
        temperature, top_p = 0.0, 1.0
    sampling = SamplingParams(temperature=temperature, top_k=max(top_k, 0), top_p=top_p,
                              seed=None if seed is None else seed % 2**64)  # numpy: seed >= 0

    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    elif not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise _bad("'stop' must be a string or a list of strings", "stop")
    if len(stop) > MAX_STOP_STRINGS:
        raise _bad(f"'stop' takes at most {MAX_STOP_STRINGS} strings, got {len(stop)}", "stop")
    stop = tuple(_check_text(s, "stop") for s in stop)

    stream = _opt_bool(body, "stream")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise _bad("'stream_options' is only allowed when 'stream' is true", "stream_options")
        if not isinstance(options, dict):
            raise _bad("'stream_options' must be an object", "stream_options")
        include_usage = _opt_bool(options, "include_usage")
    return dict(sampling=sampling, stop=stop, stream=stream, include_usage=include_usage)


def _resolve_max_tokens(body, names: tuple[str, ...], n_prompt: int, n_ctx: int,
                        default: int | None, prompt_param: str) -> int:
    """max_tokens against the context: prompt + completion must fit, as OpenAI enforces it."""
    name = next((k for k in names if body.get(k) is not None), names[0])
    asked = _opt_int(body, name)
    if asked is not None and asked < 1:
        raise _bad(f"'{name}' must be at least 1, got {asked}", name)
    if n_prompt >= n_ctx:
        raise _bad(f"This model's maximum context length is {n_ctx} tokens, but the prompt has "
                   f"{n_prompt}; shorten the prompt (or start the server with a larger --ctx)",
                   prompt_param, "context_length_exceeded")
    room = n_ctx - n_prompt
    if asked is None:
        return room if default is None else min(default, room)
    if asked > room:
        raise _bad(f"This model's maximum context length is {n_ctx} tokens; you requested "
                   f"{n_prompt + asked} ({n_prompt} in the prompt, {asked} in the completion). "
                   f"Reduce '{name}' to at most {room} or shorten the prompt",
                   name, "context_length_exceeded")
    return asked


def parse_completion(body, tokenizer, n_ctx: int, served_model: str) -> GenerationRequest:
    """POST /v1/completions. `prompt`: a string, or one prompt as a list of token ids
    (a list holding one string or one id list is accepted too; several prompts are not)."""
    common = _parse_common(body, served_model)
    prompt = body.get("prompt")
    if prompt is None:
        raise _bad("'prompt' is required", "prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]          # a batch of one
    if isinstance(prompt, str):
        ids = tokenizer.encode(_check_text(prompt, "prompt"))
    elif isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        if not all(0 <= t < tokenizer.vocab_size for t in prompt):
            raise _bad(f"'prompt' holds a token id outside the vocabulary "
                       f"(0..{tokenizer.vocab_size - 1})", "prompt")
        ids = list(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise _bad("'prompt' must be a single prompt; this server runs one sequence per "
                   "request (send the prompts as separate requests)", "prompt")
    else:
        raise _bad("'prompt' must be a string or a list of token ids", "prompt")
    if not ids:
        raise _bad("'prompt' is empty", "prompt")
    max_tokens = _resolve_max_tokens(body, ("max_tokens",), len(ids), n_ctx, 16, "prompt")
    return GenerationRequest(ids, max_tokens, **common)


def _message_text(content, i: int) -> str:
    where = f"messages[{i}].content"
    if isinstance(content, str):
        return _check_text(content, where, "messages")
    if isinstance(content, list):       # content parts: only text ones
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" \
                    or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise _bad(f"{where}: only text parts ({{\"type\": \"text\", \"text\": ...}}) "
                           f"are supported, got {_show(kind)}", "messages")
            texts.append(_check_text(part["text"], where, "messages"))
        return "".join(texts)
    raise _bad(f"{where} must be a string or a list of text parts", "messages")


def parse_chat(body, tokenizer, n_ctx: int, served_model: str) -> GenerationRequest:
    """POST /v1/chat/completions: system/user/assistant messages through the chat template."""
    from .chat_template import ChatTemplateError

    common = _parse_common(body, served_model)
    messages = body.get("messages")
    if messages is None:
        raise _bad("'messages' is required", "messages")
    if not isinstance(messages, list):
        raise _bad("'messages' must be a list of {\"role\": ..., \"content\": ...} objects",
                   "messages")
    if not messages:
        raise _bad("'messages' is empty; send at least one message", "messages")
    chat = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise _bad(f"messages[{i}] must be an object with 'role' and 'content'", "messages")
        role = m.get("role")
        if role not in CHAT_ROLES:
            raise _bad(f"messages[{i}].role must be one of {', '.join(CHAT_ROLES)}, got "
                       f"{_show(role)}", "messages")
        if m.get("content") is None:
            raise _bad(f"messages[{i}].content is required (tool calls are not supported)",
                       "messages")
        chat.append({"role": CHAT_ROLES[role], "content": _message_text(m["content"], i)})
    try:
        text = tokenizer.apply_chat_template(chat, add_generation_prompt=True)
    except ChatTemplateError as e:      # no template, or the template refused the conversation
        raise _bad(str(e), "messages") from None
    ids = tokenizer.encode(text)
    max_tokens = _resolve_max_tokens(body, ("max_completion_tokens", "max_tokens"), len(ids),
                                     n_ctx, None, "messages")
    return GenerationRequest(ids, max_tokens, **common)


# --------------------------------------------------------------------------- the engine thread

@dataclass(eq=False)
class Job:
    """One generation: made on the event loop, run on the engine thread.

    The engine thread posts ("piece", str), then ("done", stats) or ("error", APIError) to
    `events` through the loop; `cancel` goes the other way and is checked between tokens.
    """
    request: GenerationRequest
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)
    stats: GenerationStats = field(default_factory=GenerationStats)

    def post(self, kind: str, value) -> None:
        """Called from the engine thread."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))
        except RuntimeError:            # the event loop is closed: nobody is listening
            self.cancel.set()

    async def pieces(self):
        """The text pieces as they come; raises APIError if the generation failed."""
        while True:
            kind, value = await self.events.get()
            if kind == "piece":
                yield value
            elif kind == "done":
                if value.finish_reason == "cancelled":     # only close() cancels a live job
                    raise APIError(503, "The server is shutting down; the generation was "
                                        "cancelled", code="shutting_down")
                return
            else:
                raise value


class EngineWorker:
    """The one thread that owns the backend; runs queued jobs one at a time, in order."""

    def __init__(self, backend, tokenizer, queue_size: int):
        self.backend, self.tokenizer = backend, tokenizer
        self.queue_size = queue_size
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closing = False
        self.current: Job | None = None

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    @property
    def busy(self) -> bool:
        return self.current is not None

    def start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="bw24nb-engine",
                                                daemon=True)
                self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue a job, or answer 429 at once when `queue_size` jobs already wait."""
        if self._closing:
            raise APIError(503, "The server is shutting down", code="shutting_down")
        self.start()
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            raise APIError(429, f"The server is busy: {self.queue_size} requests are already "
                                f"waiting for the engine. Retry shortly.",
                           code="queue_full", headers={"Retry-After": "1"}) from None

    def close(self, timeout: float = 10.0) -> None:
        """Cancel the running and waiting jobs and stop the thread."""
        self._closing = True
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.cancel.set()
                job.post("error", APIError(503, "The server is shutting down",
                                           code="shutting_down"))
        current = self.current
        if current is not None:
            current.cancel.set()
        if self._thread is not None:
            try:
                self._queue.put(None, timeout=timeout)    # wakes the thread; it then exits
            except queue.Full:
                pass
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            if job.cancel.is_set():          # its client left while it waited
                continue
            self.current = job
            try:
                self._generate(job)
            finally:
                self.current = None

    def _generate(self, job: Job) -> None:
        r = job.request
        try:
            for piece in generate(self.backend, self.tokenizer, r.prompt_ids, r.max_tokens,
                                  r.sampling, r.stop, job.cancel, job.stats):
                job.post("piece", piece)
        except ContextOverflow as e:         # parse_* checks this first; kept as a 400 anyway
            job.post("error", _bad(str(e), "prompt", "context_length_exceeded"))
        except Exception:
            log.exception("generation failed (prompt of %d tokens, max_tokens %d)",
                          len(r.prompt_ids), r.max_tokens)
            job.post("error", _engine_failure())
        else:
            job.post("done", job.stats)


# --------------------------------------------------------------------------- HTTP

@dataclass
class ServerState:
    tokenizer: object
    n_ctx: int
    model_name: str
    worker: EngineWorker
    created: int


def _state(request: Request) -> ServerState:
    return request.app.state.bw24


async def _read_json(request: Request) -> dict:
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > MAX_BODY_BYTES:
        raise APIError(413, f"The request body is larger than {MAX_BODY_BYTES} bytes")
    chunks, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > MAX_BODY_BYTES:
            raise APIError(413, f"The request body is larger than {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks))
    except (ValueError, RecursionError) as e:   # JSONDecodeError and UnicodeDecodeError
        raise _bad(f"The request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise _bad("The request body must be a JSON object", code="invalid_json")
    return body


def _usage(stats: GenerationStats) -> dict:
    return {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.completion_tokens,
            "total_tokens": stats.prompt_tokens + stats.completion_tokens}


class _Shape:
    """How one endpoint spells its response objects and stream chunks."""

    def __init__(self, chat: bool, model: str):
        self.chat, self.model = chat, model
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _envelope(self, obj: str, choices: list, **extra) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "choices": choices, **extra}

    def full(self, text: str, stats: GenerationStats) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": stats.finish_reason}
            return self._envelope("chat.completion", [choice], usage=_usage(stats))
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": stats.finish_reason}
        return self._envelope("text_completion", [choice], usage=_usage(stats))

    def chunk(self, text: str | None, finish_reason: str | None = None, *, role=False,
              usage: GenerationStats | None = None, include_usage=False) -> str:
        if usage is not None:
            choices = []
        elif self.chat:
            delta = {"role": "assistant", "content": ""} if role else \
                ({} if text is None else {"content": text})
            choices = [{"index": 0, "delta": delta, "logprobs": None,
                        "finish_reason": finish_reason}]
        else:
            choices = [{"index": 0, "text": text or "", "logprobs": None,
                        "finish_reason": finish_reason}]
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        extra = {"usage": _usage(usage) if usage is not None else None} if include_usage else {}
        return _sse(self._envelope(obj, choices, **extra))


def _sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


class _JobStream(StreamingResponse):
    """An SSE response that cancels its job however the response ends: finished, failed, or
    the client hung up (Starlette's StreamingResponse stops on http.disconnect, even while
    the job still waits in the queue)."""

    def __init__(self, job: Job, content):
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.job = job

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel.set()


async def _stream_events(job: Job, shape: _Shape):
    include_usage = job.request.include_usage
    try:
        if shape.chat:
            yield shape.chunk(None, role=True, include_usage=include_usage)
        async for piece in job.pieces():
            yield shape.chunk(piece, include_usage=include_usage)
        yield shape.chunk(None, job.stats.finish_reason, include_usage=include_usage)
        if include_usage:
            yield shape.chunk(None, usage=job.stats, include_usage=True)
    except APIError as e:       # headers are sent: the error travels as an event (OpenAI's way)
        yield _sse(e.body())
    except Exception:
        log.exception("streaming a response failed")
        yield _sse(_engine_failure().body())
    finally:
        job.cancel.set()
    yield "data: [DONE]\n\n"


async def _client_gone(request: Request) -> None:
    """Returns when the client disconnects (the body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _collect(request: Request, job: Job) -> str | None:
    """The whole text of a non-streaming job, or None if the client hung up first."""
    async def drain():
        return "".join([p async for p in job.pieces()])

    result = asyncio.ensure_future(drain())
    gone = asyncio.ensure_future(_client_gone(request))
    try:
        await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
        if result.done():
            return result.result()
        return None
    finally:
        job.cancel.set()          # a no-op if it finished; frees the engine if not
        for t in (result, gone):
            t.cancel()


async def _generation_endpoint(request: Request, chat: bool) -> Response:
    st = _state(request)
    try:
        body = await _read_json(request)
    except ClientDisconnect:
        return Response(status_code=499)
    parse = parse_chat if chat else parse_completion
    req = await run_in_threadpool(parse, body, st.tokenizer, st.n_ctx, st.model_name)
    job = Job(req, asyncio.get_running_loop())
    st.worker.submit(job)
    shape = _Shape(chat, st.model_name)
    if req.stream:
        return _JobStream(job, _stream_events(job, shape))
    text = await _collect(request, job)
    if text is None:
        return Response(status_code=499)      # nginx's "client closed request", for the log
    return JSONResponse(shape.full(text, job.stats))


async def completions(request: Request) -> Response:
    return await _generation_endpoint(request, chat=False)


async def chat_completions(request: Request) -> Response:
    return await _generation_endpoint(request, chat=True)


def _model_card(st: ServerState) -> dict:
    return {"id": st.model_name, "object": "model", "created": st.created, "owned_by": "bw24nb"}


async def list_models(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [_model_card(_state(request))]})


async def get_model(request: Request) -> Response:
    st = _state(request)
    name = request.path_params["model"]
    if name != st.model_name:
        raise APIError(404, f"The model {_show(name)} does not exist; this server serves "
                            f"'{st.model_name}'", param="model", code="model_not_found")
    return JSONResponse(_model_card(st))


async def health(request: Request) -> Response:
    w = _state(request).worker
    return JSONResponse({"status": "ok", "busy": w.busy, "queued": w.queued})


class BearerAuth:
    """Pure ASGI middleware (streams pass straight through): every path but /health needs
    'Authorization: Bearer <key>'. Keys are compared in constant time."""

    def __init__(self, app, api_key: str):
        self.app, self.key = app, api_key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] != "/health":
            header = dict(scope["headers"]).get(b"authorization", b"")
            scheme, _, token = header.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self.key):
                message = ("Incorrect API key provided" if header else
                           "Missing API key: send 'Authorization: Bearer <key>'")
                await APIError(401, message, code="invalid_api_key").response()(scope, receive,
                                                                                 send)
                return
        await self.app(scope, receive, send)


async def _api_error(request, exc: APIError):
    return exc.response()


async def _http_error(request, exc: HTTPException):
    messages = {404: f"Unknown path {request.url.path}; the API lives under /v1",
                405: f"{request.method} is not allowed on {request.url.path}"}
    return APIError(exc.status_code, messages.get(exc.status_code, str(exc.detail)),
                    headers=exc.headers).response()


async def _internal_error(request, exc: Exception):
    # Starlette logs the traceback; the client learns only that it was not its fault
    return APIError(500, "Internal server error; the server log has the details",
                    code="internal_error").response()


def create_app(loaded_model, api_key: str | None = None, queue_size: int = 16,
               model_name: str | None = None) -> Starlette:
    """The ASGI app serving `loaded_model` (a backends.LoadedModel). The engine thread starts
    with the first request (or at startup) and stops when the app shuts down."""
    from contextlib import asynccontextmanager

    from starlette.middleware import Middleware

    if model_name is None:
        path = Path(str(loaded_model.source.path))
        model_name = path.stem if path.suffix == ".gguf" else path.name
    worker = EngineWorker(loaded_model.backend, loaded_model.tokenizer, queue_size)

    @asynccontextmanager
    async def lifespan(app):
        worker.start()
        try:
            yield
        finally:
            await run_in_threadpool(worker.close)

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", get_model, methods=["GET"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    ]
    middleware = [Middleware(BearerAuth, api_key=api_key)] if api_key else []
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan,
                    exception_handlers={APIError: _api_error, HTTPException: _http_error,
                                        Exception: _internal_error})
    app.state.bw24 = ServerState(loaded_model.tokenizer, loaded_model.backend.n_ctx, model_name,
                                 worker, int(time.time()))
    return app


def run_server(model_path, host: str = "127.0.0.1", port: int = 8080,
               api_key: str | None = None, n_ctx: int = 4096, backend: str = "auto",
               queue_size: int = 16, model_name: str | None = None,
               engine_options: dict | None = None) -> None:
    """Load the model, then serve it with uvicorn until interrupted. engine_options: extra
    Engine(...) arguments (KV cache types, VRAM budget, activation path) for the GPU backend."""
    import ipaddress
    import sys

    import uvicorn

    from . import backends

    def say(message):
        print(message, file=sys.stderr, flush=True)

    # engine failures are logged here with their traceback (clients get a generic 500)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(name)s: %(message)s")

    lm = backends.load(model_path, n_ctx=n_ctx, which=backend, log=say,
                       engine_options=engine_options)
    app = create_app(lm, api_key=api_key, queue_size=queue_size, model_name=model_name)
    st = app.state.bw24
    say(f"backend: {lm.backend.name}; load {lm.load_s:.2f} s; context {st.n_ctx} tokens")
    say(f"serving '{st.model_name}' at http://{host}:{port}/v1 "
        f"({'Bearer auth on' if api_key else 'no auth'}; queue {queue_size})")
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback and not api_key:
        say(f"warning: listening on {host} without --api-key: anyone who can reach this "
            f"address can use the model")
    # a short graceful shutdown: open streams are cut (their jobs cancelled) after 3 s
    uvicorn.run(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=3)
