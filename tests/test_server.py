"""The OpenAI-compatible server, driven by the official `openai` client over a real socket.

Each server runs uvicorn in a background thread on a free 127.0.0.1 port with the tiny Qwen3
fixture on the numpy reference backend. Expected outputs come from an independent copy of the
same model run through `bw24nb.generate.generate` directly (the "oracle"), so every text the
server returns is checked character for character, not just for shape.

Tests about queueing and cancellation wrap the model in `SlowBackend` (a fixed sleep per decoded
token, recording what the engine ran) so that a queue can form and a cancelled generation is
visibly shorter than an uncancelled one.
"""
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import openai
import pytest
import uvicorn
from click.testing import CliRunner

from bw24nb import backends
from bw24nb.cli import main as cli_main
from bw24nb.generate import GenerationStats, generate
from bw24nb.sampling import SamplingParams
from bw24nb.server import create_app

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "qwen3", "model.gguf")
N_CTX = 256
MODEL = "tiny-qwen3"
ERROR_KEYS = {"message", "type", "param", "code"}


# --------------------------------------------------------------------------- harness

def load_fixture():
    return backends.load(FIXTURE, n_ctx=N_CTX, which="cpu", log=lambda m: None)


@contextmanager
def serving(app):
    """Run `app` under uvicorn on a free loopback port; yield its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on",
                                           timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    assert wait_until(lambda: server.started or not thread.is_alive(), 10) and server.started
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
        assert not thread.is_alive(), "the server did not shut down"


def wait_until(predicate, timeout=5.0, step=0.01) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


def openai_client(base_url, api_key="anything", **kw):
    # max_retries=0: the client would otherwise retry 429/500 and hide them from the test
    return openai.OpenAI(base_url=base_url + "/v1", api_key=api_key, max_retries=0,
                         timeout=kw.pop("timeout", 60), **kw)


class SlowBackend:
    """The fixture model slowed to `delay` seconds per decoded token, recording its work."""

    def __init__(self, inner, delay):
        self.inner, self.delay = inner, delay
        self.name, self.n_ctx = inner.name, inner.n_ctx
        self.prefills = []          # prompt ids, in the order the engine ran them
        self.decodes = 0

    def reset(self):
        self.inner.reset()

    def prefill(self, ids):
        self.prefills.append(list(ids))
        return self.inner.prefill(ids)

    def decode(self, token):
        time.sleep(self.delay)
        self.decodes += 1
        return self.inner.decode(token)


class FailingBackend:
    """An engine that breaks on every prefill, with a message no client may ever see."""
    name, n_ctx = "failing", N_CTX

    def reset(self):
        pass

    def prefill(self, ids):
        raise RuntimeError("secret-internal-detail /srv/weights.bin")

    def decode(self, token):
        raise AssertionError("unreachable")


def health(base_url):
    return httpx.get(base_url + "/health").json()


# --------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def oracle():
    """An independent copy of the model for expected outputs (the server's is not shared:
    a backend is not thread-safe)."""
    return load_fixture()


@pytest.fixture(scope="module")
def spare_model():
    """A third copy for the per-test servers (one at a time, each shut down after its test)."""
    return load_fixture()


@pytest.fixture(scope="module")
def base_url():
    with serving(create_app(load_fixture(), model_name=MODEL)) as url:
        yield url


@pytest.fixture(scope="module")
def client(base_url):
    c = openai_client(base_url)
    yield c
    c.close()


def expect(oracle, prompt, max_tokens, sampling=SamplingParams(), stop=()):
    """(text, stats) from generate() itself; `prompt` is text or token ids."""
    ids = oracle.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
    stats = GenerationStats()
    text = "".join(generate(oracle.backend, oracle.tokenizer, ids, max_tokens, sampling,
                            stop=stop, stats=stats))
    return text, stats


def chat_ids(oracle, messages):
    return oracle.tokenizer.encode(oracle.tokenizer.apply_chat_template(messages))


# --------------------------------------------------------------------------- plain requests

def test_models_and_health(client, base_url):
    assert [m.id for m in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")
    r = httpx.get(base_url + "/health")
    assert r.status_code == 200 and r.json() == {"status": "ok", "busy": False, "queued": 0}


def test_greedy_completion_equals_generate(client, oracle):
    text, st = expect(oracle, "Hello world", 24)
    r = client.completions.create(model=MODEL, prompt="Hello world", max_tokens=24,
                                  temperature=0)
    assert r.object == "text_completion" and r.model == MODEL and r.id.startswith("cmpl-")
    assert r.choices[0].text == text and r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == \
        (st.prompt_tokens, 24, st.prompt_tokens + 24)
    # the same prompt given as token ids
    ids = oracle.tokenizer.encode("Hello world")
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=24, temperature=0)
    assert r.choices[0].text == text


def test_greedy_output_equals_bw24nb_gen(client):
    prompt = "The quick brown fox"
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=30, temperature=0)
    run = CliRunner().invoke(cli_main, ["gen", FIXTURE, "--prompt", prompt, "-n", "30",
                                        "--backend", "cpu", "--no-gate", "--ctx", str(N_CTX)])
    assert run.exit_code == 0, run.output
    assert "finish: length" in run.stderr
    assert run.stdout == r.choices[0].text + "\n"


def test_eos_ends_with_finish_reason_stop(client, oracle):
    text, st = expect(oracle, "abc", 40)
    assert st.finish_reason == "stop" and st.completion_tokens < 40   # the fixture emits EOS
    r = client.completions.create(model=MODEL, prompt="abc", max_tokens=40, temperature=0)
    assert r.choices[0].text == text and r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == st.completion_tokens


def test_streaming_completion(client, oracle, base_url):
    text, st = expect(oracle, "Once upon a time", 20)
    stream = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=20,
                                       temperature=0, stream=True,
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    with_choices = [c for c in chunks if c.choices]
    assert len(with_choices) > 2          # streamed in pieces, not in one lump
    assert "".join(c.choices[0].text for c in with_choices) == text
    assert [c.choices[0].finish_reason for c in with_choices] == \
        [None] * (len(with_choices) - 1) + ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20
    assert chunks[-1].usage.prompt_tokens == st.prompt_tokens
    # the wire format: SSE events "data: {json}\n\n", closed by "data: [DONE]\n\n"
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 5, "stream": True}
    with httpx.stream("POST", base_url + "/v1/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = raw.split("\n\n")
    assert raw.endswith("data: [DONE]\n\n") and events[-1] == ""
    assert all(e.startswith("data: ") for e in events[:-1])


def test_chat_plain_and_streaming(client, oracle):
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Name a colour."},
                {"role": "assistant", "content": "Blue."},
                {"role": "user", "content": "Another one?"}]
    ids = chat_ids(oracle, messages)
    text, st = expect(oracle, ids, 20)
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20,
                                       temperature=0)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == text
    assert r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ids), 20)

    chunks = list(client.chat.completions.create(model=MODEL, messages=messages,
                                                 max_completion_tokens=20, temperature=0,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.object == "chat.completion.chunk" and c.usage is None for c in chunks)

    # content given as text parts renders the same prompt
    parts = [dict(m, content=[{"type": "text", "text": m["content"]}]) for m in messages]
    r = client.chat.completions.create(model=MODEL, messages=parts, max_tokens=20, temperature=0)
    assert r.choices[0].message.content == text


def test_chat_without_max_tokens_runs_to_eos(client, oracle):
    messages = [{"role": "user", "content": "hi"}]
    ids = chat_ids(oracle, messages)
    text, st = expect(oracle, ids, N_CTX - len(ids))
    r = client.chat.completions.create(model=MODEL, messages=messages, temperature=0)
    assert r.choices[0].message.content == text
    assert r.choices[0].finish_reason == st.finish_reason
    assert r.usage.completion_tokens == st.completion_tokens


# --------------------------------------------------------------------------- stop strings

def boundary_stop(oracle, token_ids):
    """A two-character stop string made of the last character of one token and the first of
    the next: it can only be found by looking across a token boundary."""
    pieces = [oracle.tokenizer.decode([t]) for t in token_ids]
    for a, b in zip(pieces, pieces[1:]):
        if a and b and all(c.isascii() and c.isalnum() for c in (a[-1], b[0])):
            return a[-1] + b[0]
    raise AssertionError("the fixture's output has no alphanumeric token boundary")


def test_stop_strings_cut_exactly(client, oracle):
    full, st = expect(oracle, "Hello world", 40)
    stop = boundary_stop(oracle, st.token_ids)
    later = full[full.find(stop) + len(stop):][:2]      # occurs only after `stop`
    assert later and full.find(later) > full.find(stop)
    cut = full[:full.find(stop)]
    assert cut == expect(oracle, "Hello world", 40, stop=(stop,))[0]

    for stops in (stop, [later, "never-in-the-output", stop]):
        r = client.completions.create(model=MODEL, prompt="Hello world", max_tokens=40,
                                      temperature=0, stop=stops)
        assert r.choices[0].text == cut and r.choices[0].finish_reason == "stop"
        streamed = list(client.completions.create(model=MODEL, prompt="Hello world",
                                                  max_tokens=40, temperature=0, stop=stops,
                                                  stream=True))
        assert "".join(c.choices[0].text for c in streamed) == cut
        assert streamed[-1].choices[0].finish_reason == "stop"

    # a stop string that never occurs leaves the text whole
    r = client.completions.create(model=MODEL, prompt="Hello world", max_tokens=40,
                                  temperature=0, stop="never-in-the-output")
    assert r.choices[0].text == full and r.choices[0].finish_reason == "length"


def test_stop_strings_in_chat(client, oracle):
    messages = [{"role": "user", "content": "Say something."}]
    ids = chat_ids(oracle, messages)
    full, st = expect(oracle, ids, 40)
    stop = boundary_stop(oracle, st.token_ids)
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=40,
                                       temperature=0, stop=[stop])
    assert r.choices[0].message.content == full[:full.find(stop)]
    assert r.choices[0].finish_reason == "stop"


# --------------------------------------------------------------------------- sampling

def test_seeded_sampling_is_reproducible(client, oracle):
    kw = dict(model=MODEL, prompt="Once upon a time", max_tokens=24, temperature=1.0, top_p=0.9)
    a = client.completions.create(seed=1234, **kw).choices[0].text
    b = client.completions.create(seed=1234, **kw).choices[0].text
    c = client.completions.create(seed=4321, **kw).choices[0].text
    assert a == b == expect(oracle, "Once upon a time", 24, SamplingParams(1.0, 0, 0.9, 1234))[0]
    assert c == expect(oracle, "Once upon a time", 24, SamplingParams(1.0, 0, 0.9, 4321))[0]
    assert a != c
    streamed = client.completions.create(seed=1234, stream=True, **kw)
    assert "".join(ch.choices[0].text for ch in streamed) == a
    # top_k is an extension field (as in vLLM and llama.cpp's server)
    k = client.completions.create(seed=1234, extra_body={"top_k": 3}, **kw).choices[0].text
    assert k == expect(oracle, "Once upon a time", 24, SamplingParams(1.0, 3, 0.9, 1234))[0]
    # top_p = 0 keeps only the most likely token: greedy, whatever the temperature and seed
    g = client.completions.create(**dict(kw, top_p=0.0)).choices[0].text
    assert g == expect(oracle, "Once upon a time", 24)[0]


def test_concurrent_requests_all_answered(base_url, oracle):
    """10 clients at once (plain, streaming, chat; greedy and seeded): every answer exact."""
    jobs = []
    for i in range(10):
        sampling = SamplingParams() if i % 2 == 0 else SamplingParams(0.8, 0, 1.0, 100 + i)
        kind = ("completion", "stream", "chat")[i % 3]
        if kind == "chat":
            messages = [{"role": "user", "content": f"Question number {i}?"}]
            prompt = messages
            expected = expect(oracle, chat_ids(oracle, messages), 10 + i, sampling)[0]
        else:
            prompt = f"Request number {i} says"
            expected = expect(oracle, prompt, 10 + i, sampling)[0]
        jobs.append((kind, prompt, 10 + i, sampling, expected))

    client = openai_client(base_url)

    def ask(job):
        kind, prompt, n, sp, _ = job
        kw = dict(model=MODEL, max_tokens=n, temperature=sp.temperature, seed=sp.seed)
        if kind == "chat":
            return client.chat.completions.create(messages=prompt, **kw).choices[0].message.content
        if kind == "stream":
            return "".join(c.choices[0].text
                           for c in client.completions.create(prompt=prompt, stream=True, **kw))
        return client.completions.create(prompt=prompt, **kw).choices[0].text

    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        answers = list(pool.map(ask, jobs))
    client.close()
    assert answers == [job[-1] for job in jobs]
    assert health(base_url) == {"status": "ok", "busy": False, "queued": 0}


# --------------------------------------------------------------------------- load and faults

def test_full_queue_answers_429_and_jobs_run_in_order(spare_model, oracle):
    slow = SlowBackend(spare_model.backend, delay=0.02)
    app = create_app(dataclasses.replace(spare_model, backend=slow), queue_size=2,
                     model_name=MODEL)
    with serving(app) as url:
        client = openai_client(url)
        first = client.completions.create(model=MODEL, prompt="Hello world", max_tokens=200,
                                          temperature=0, stream=True)
        next(iter(first))                       # the engine is now busy with it
        results = {}

        def ask(prompt):
            results[prompt] = client.completions.create(model=MODEL, prompt=prompt, max_tokens=5,
                                                        temperature=0).choices[0].text

        waiting = [threading.Thread(target=ask, args=(p,)) for p in ("one", "two")]
        for n, t in enumerate(waiting, 1):      # one at a time, so the queue order is known
            t.start()
            assert wait_until(lambda: health(url)["queued"] == n)
        # queue (2) full: refused at once, with a JSON body, not a dropped connection
        r = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "three"})
        assert r.status_code == 429 and set(r.json()["error"]) == ERROR_KEYS
        assert r.json()["error"]["code"] == "queue_full" and "Retry-After" in r.headers
        with pytest.raises(openai.RateLimitError):
            client.completions.create(model=MODEL, prompt="three", max_tokens=5)

        first.close()                           # cancel the long one; the queue drains
        for t in waiting:
            t.join(10)
        assert results == {p: expect(oracle, p, 5)[0] for p in ("one", "two")}
        tok = spare_model.tokenizer
        assert slow.prefills == [tok.encode(p) for p in ("Hello world", "one", "two")]
        client.close()


def test_cancelled_stream_frees_the_engine_at_once(spare_model, oracle):
    slow = SlowBackend(spare_model.backend, delay=0.05)    # 200 tokens would take 10 s
    app = create_app(dataclasses.replace(spare_model, backend=slow), model_name=MODEL)
    with serving(app) as url:
        client = openai_client(url)
        stream = client.completions.create(model=MODEL, prompt="Hello world", max_tokens=200,
                                           temperature=0, stream=True)
        it = iter(stream)
        for _ in range(3):
            next(it)
        t0 = time.monotonic()
        stream.close()
        # uncancelled it would run ~10 s more; the bounds leave room for a loaded CI machine
        assert wait_until(lambda: not health(url)["busy"], timeout=3)
        assert time.monotonic() - t0 < 2.0
        stopped_at = slow.decodes
        assert stopped_at < 60
        # the next request is served normally, and the cancelled one never resumes
        r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8,
                                      temperature=0)
        assert r.choices[0].text == expect(oracle, "Once upon a time", 8)[0]
        assert slow.decodes == stopped_at + 7   # 8 tokens: 1 from prefill + 7 decodes
        client.close()


def test_client_leaving_a_plain_request_cancels_it_queued_or_running(spare_model):
    slow = SlowBackend(spare_model.backend, delay=0.05)
    app = create_app(dataclasses.replace(spare_model, backend=slow), model_name=MODEL)
    with serving(app) as url:
        body = {"model": MODEL, "prompt": "Hello world", "max_tokens": 200, "temperature": 0}
        # running: the client gives up after 0.3 s; the engine must stop right after
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + "/v1/completions", json=body, timeout=httpx.Timeout(5, read=0.3))
        assert wait_until(lambda: not health(url)["busy"], timeout=3)
        assert slow.decodes < 60                # of 199 had it run on

        # queued: a request whose client left before its turn never runs
        client = openai_client(url)
        running = client.completions.create(stream=True, **body)
        next(iter(running))
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + "/v1/completions", json=dict(body, prompt="never run"),
                       timeout=httpx.Timeout(5, read=0.3))
        running.close()
        assert wait_until(lambda: health(url) == {"status": "ok", "busy": False, "queued": 0})
        assert slow.prefills == [spare_model.tokenizer.encode("Hello world")] * 2
        client.close()


def test_shutdown_mid_stream_stops_the_engine(spare_model):
    slow = SlowBackend(spare_model.backend, delay=0.05)
    app = create_app(dataclasses.replace(spare_model, backend=slow), model_name=MODEL)
    with serving(app) as url:
        client = openai_client(url)
        # greedy: "Hello world" runs all 200 tokens without EOS, so the generation is still
        # going at shutdown (at the API's default temperature 1 a sampled EOS could end it first)
        stream = iter(client.completions.create(model=MODEL, prompt="Hello world", max_tokens=200,
                                                temperature=0, stream=True))
        next(stream)
        t0 = time.monotonic()
    # serving() returns once uvicorn and the engine thread have stopped (2 s grace for streams)
    assert time.monotonic() - t0 < 6 and slow.decodes < 150
    stopped_at = slow.decodes
    with pytest.raises((openai.APIError, httpx.HTTPError)):
        list(stream)                # cut short, never a silent truncation posing as complete
    time.sleep(0.2)
    assert slow.decodes == stopped_at
    client.close()


def test_engine_failure_is_a_generic_500(spare_model, caplog):
    app = create_app(dataclasses.replace(spare_model, backend=FailingBackend()), model_name=MODEL)
    with serving(app) as url:
        r = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "hi"})
        assert r.status_code == 500 and set(r.json()["error"]) == ERROR_KEYS
        assert r.json()["error"]["type"] == "server_error"
        assert "secret" not in r.text and "Traceback" not in r.text
        client = openai_client(url)
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
        # streaming: the status is already 200 when the engine fails, so the error is an event
        with pytest.raises(openai.APIError) as e:
            list(client.completions.create(model=MODEL, prompt="hi", stream=True))
        assert "secret" not in str(e.value)
        assert health(url)["status"] == "ok"
        client.close()
    # ... and the traceback is in the server's log
    assert any(rec.name == "bw24nb.server" and rec.exc_info and "secret" in str(rec.exc_info[1])
               for rec in caplog.records)


class BrokenTokenizer:
    """The fixture's tokenizer, except that encoding fails: an unexpected error in the
    request path, before any job exists."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def encode(self, text):
        raise ValueError("secret-internal-detail in the tokenizer")


def test_unexpected_error_in_a_handler_is_a_generic_500(spare_model):
    app = create_app(dataclasses.replace(spare_model, tokenizer=BrokenTokenizer(
        spare_model.tokenizer)), model_name=MODEL)
    with serving(app) as url:
        for path, body in (("/v1/completions", {"model": MODEL, "prompt": "hi"}),
                           ("/v1/chat/completions",
                            {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})):
            r = httpx.post(url + path, json=body)
            assert r.status_code == 500 and set(r.json()["error"]) == ERROR_KEYS
            assert r.json()["error"]["type"] == "server_error"
            assert "secret" not in r.text and "Traceback" not in r.text
        # client mistakes found before the tokenizer runs are still 4xx
        check_error(httpx.post(url + "/v1/completions", json={"model": MODEL}), 400, "prompt")
        assert health(url)["status"] == "ok"


LONG = "hello " * 300        # > N_CTX tokens
COMPLETION_ERRORS = [
    # (raw body or JSON object, status, param, code)
    (b"{not json", 400, None, "invalid_json"),
    (b"\xff\xfe\x00", 400, None, "invalid_json"),
    (b"[1, 2]", 400, None, "invalid_json"),
    (b'{"model": "tiny-qwen3", "prompt": "x", "temperature": NaN}', 400, "temperature", None),
    (b'{"model": "tiny-qwen3", "prompt": "\\ud800"}', 400, "prompt", None),
    ({}, 400, "model", None),
    ({"model": 5, "prompt": "x"}, 400, "model", None),
    ({"model": "gpt-4o", "prompt": "x"}, 404, "model", "model_not_found"),
    ({"model": MODEL}, 400, "prompt", None),
    ({"model": MODEL, "prompt": 42}, 400, "prompt", None),
    ({"model": MODEL, "prompt": ""}, 400, "prompt", None),
    ({"model": MODEL, "prompt": ["a", "b"]}, 400, "prompt", None),
    ({"model": MODEL, "prompt": [10**6]}, 400, "prompt", None),
    ({"model": MODEL, "prompt": LONG}, 400, "prompt", "context_length_exceeded"),
    ({"model": MODEL, "prompt": "x", "max_tokens": -5}, 400, "max_tokens", None),
    ({"model": MODEL, "prompt": "x", "max_tokens": 0}, 400, "max_tokens", None),
    ({"model": MODEL, "prompt": "x", "max_tokens": 10**12}, 400, "max_tokens",
     "context_length_exceeded"),
    ({"model": MODEL, "prompt": "x", "max_tokens": "16"}, 400, "max_tokens", None),
    ({"model": MODEL, "prompt": "x", "max_tokens": 1.5}, 400, "max_tokens", None),
    ({"model": MODEL, "prompt": "x", "max_tokens": True}, 400, "max_tokens", None),
    ({"model": MODEL, "prompt": "x", "temperature": "hot"}, 400, "temperature", None),
    ({"model": MODEL, "prompt": "x", "temperature": -0.5}, 400, "temperature", None),
    ({"model": MODEL, "prompt": "x", "top_p": 1.5}, 400, "top_p", None),
    ({"model": MODEL, "prompt": "x", "top_k": "all"}, 400, "top_k", None),
    ({"model": MODEL, "prompt": "x", "seed": "lucky"}, 400, "seed", None),
    ({"model": MODEL, "prompt": "x", "stop": 5}, 400, "stop", None),
    ({"model": MODEL, "prompt": "x", "stop": [1]}, 400, "stop", None),
    ({"model": MODEL, "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", None),
    ({"model": MODEL, "prompt": "x", "stream": "yes"}, 400, "stream", None),
    ({"model": MODEL, "prompt": "x", "stream_options": {"include_usage": True}}, 400,
     "stream_options", None),
    ({"model": MODEL, "prompt": "x", "n": 2}, 400, "n", None),
    ({"model": MODEL, "prompt": "x", "presence_penalty": 0.5}, 400, "presence_penalty",
     "unsupported_parameter"),
]
CHAT_ERRORS = [
    (b'{"model": "tiny-qwen3", "messages": [{"role": "user", "content": "\\udfff"}]}', 400,
     "messages", None),
    ({"model": MODEL}, 400, "messages", None),
    ({"model": MODEL, "messages": "hi"}, 400, "messages", None),
    ({"model": MODEL, "messages": []}, 400, "messages", None),
    ({"model": MODEL, "messages": ["hi"]}, 400, "messages", None),
    ({"model": MODEL, "messages": [{"content": "hi"}]}, 400, "messages", None),
    ({"model": MODEL, "messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages", None),
    ({"model": MODEL, "messages": [{"role": "user"}]}, 400, "messages", None),
    ({"model": MODEL, "messages": [{"role": "user", "content": 5}]}, 400, "messages", None),
    ({"model": MODEL, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}, 400, "messages", None),
    ({"model": MODEL, "messages": [{"role": "user", "content": LONG}]}, 400, "messages",
     "context_length_exceeded"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}, 400,
     "max_tokens", None),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
      "max_completion_tokens": 10**9}, 400, "max_completion_tokens", "context_length_exceeded"),
    ({"model": "nope", "messages": [{"role": "user", "content": "hi"}]}, 404, "model",
     "model_not_found"),
]


def check_error(r, status, param=None, code=None):
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert set(err) == ERROR_KEYS and isinstance(err["message"], str) and err["message"]
    assert err["type"] == "invalid_request_error"
    assert (err["param"], err["code"]) == (param, code)
    assert "Traceback" not in r.text


@pytest.mark.parametrize("path,body,status,param,code",
                         [("/v1/completions", *case) for case in COMPLETION_ERRORS]
                         + [("/v1/chat/completions", *case) for case in CHAT_ERRORS])
def test_bad_input_gets_an_openai_style_4xx(base_url, path, body, status, param, code):
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    check_error(httpx.post(base_url + path, **kw), status, param, code)
    if isinstance(body, dict) and not {"stream", "stream_options"} & set(body):
        # a streaming request is validated before the stream starts: the same 4xx
        check_error(httpx.post(base_url + path, json=dict(body, stream=True)), status, param, code)


def test_bad_routes_and_methods(base_url):
    check_error(httpx.get(base_url + "/v1/nowhere"), 404)
    check_error(httpx.get(base_url + "/v1/completions"), 405)
    check_error(httpx.post(base_url + "/v1/models"), 405)


def test_openai_client_sees_typed_errors_and_server_carries_on(client, oracle):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="x", max_tokens=-1)
    assert e.value.status_code == 400 and e.value.body["param"] == "max_tokens"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="empty"):
        client.chat.completions.create(model=MODEL, messages=[])
    r = client.completions.create(model=MODEL, prompt="Hello world", max_tokens=6, temperature=0)
    assert r.choices[0].text == expect(oracle, "Hello world", 6)[0]


# --------------------------------------------------------------------------- auth

def test_api_key_guards_everything_but_health(spare_model, oracle):
    app = create_app(spare_model, api_key="s3cret", model_name=MODEL)
    with serving(app) as url:
        good = openai_client(url, api_key="s3cret")
        assert [m.id for m in good.models.list()] == [MODEL]
        r = good.completions.create(model=MODEL, prompt="abc", max_tokens=5, temperature=0)
        assert r.choices[0].text == expect(oracle, "abc", 5)[0]
        bad = openai_client(url, api_key="wrong")
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
        with pytest.raises(openai.AuthenticationError):
            bad.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
        for headers in ({}, {"Authorization": "s3cret"}, {"Authorization": "Basic s3cret"},
                        {"Authorization": "Bearer s3cret-and-more"}):
            check_error(httpx.get(url + "/v1/models", headers=headers), 401, None,
                        "invalid_api_key")
            check_error(httpx.post(url + "/v1/completions", headers=headers,
                                   json={"model": MODEL, "prompt": "x"}), 401, None,
                        "invalid_api_key")
        assert httpx.get(url + "/health").status_code == 200
        good.close()
        bad.close()


def test_without_api_key_no_auth_is_needed(base_url):
    r = httpx.get(base_url + "/v1/models")          # no Authorization header at all
    assert r.status_code == 200 and r.json()["data"][0]["id"] == MODEL


# --------------------------------------------------------------------------- the CLI

def test_bw24nb_serve_command(oracle):
    """`bw24nb serve` end to end in a child process, on loopback, with Bearer auth."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "bw24nb.cli", "serve", FIXTURE, "--port",
                             str(port), "--backend", "cpu", "--ctx", str(N_CTX), "--api-key", "k",
                             "--model-name", MODEL], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        url = f"http://127.0.0.1:{port}"

        def up():
            try:
                return httpx.get(url + "/health").status_code == 200
            except httpx.TransportError:
                return False
        assert wait_until(up, timeout=60, step=0.1), "the server did not come up"
        client = openai_client(url, api_key="k")
        r = client.completions.create(model=MODEL, prompt="Hello world", max_tokens=10,
                                      temperature=0)
        assert r.choices[0].text == expect(oracle, "Hello world", 10)[0]
        client.close()
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    assert proc.returncode == 0, out
    assert f"serving '{MODEL}' at http://127.0.0.1:{port}/v1" in out
