"""The `bw24nb` command line (click). Every option is also settable as BW24_<NAME>."""
from __future__ import annotations

import sys
import time

import click

from .errors import Bw24Error


class _Group(click.Group):
    """Turn bw24nb's own errors into one clear line and exit status 2, not a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except Bw24Error as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(2)


@click.group(cls=_Group, context_settings={"auto_envvar_prefix": "BW24", "show_default": True})
def main():
    """bw24nb: LLM inference on Numba-CUDA (Qwen2/Qwen3/Qwen3.5 from GGUF or HF safetensors)."""


def _model_path(model):
    if model:
        return model
    from .pull import pull
    return str(pull(log=lambda m: click.echo(m, err=True)))


@main.command()
def pull():
    """Fetch the default model (Qwen2.5-Coder-0.5B-Instruct GGUF) into the cache and verify it."""
    from .pull import pull as do_pull
    click.echo(str(do_pull()))


@main.command()
@click.argument("model", required=False)
def inspect(model):
    """Print a model's configuration and a summary of its tensors."""
    from collections import Counter

    from .formats import open_model
    from .quant import QType

    src = open_model(_model_path(model))
    click.echo(f"{src.path}  ({src.format})")
    for k, v in vars(src.config).items():
        if k == "layer_types" and v:
            v = "".join("F" if t == "full_attention" else "L" for t in v) + "  (F full, L linear)"
        click.echo(f"  {k:34s} {v}")
    names = src.names()
    by_type, total = Counter(), 0
    for n in names:
        info = src.info(n)
        name = QType(info.qtype).name if info.qtype in QType._value2member_map_ else str(info.qtype)
        by_type[name] += info.nbytes
        total += info.nbytes
    click.echo(f"  tensors: {len(names)}, {total / 2**20:.1f} MiB")
    for t, b in by_type.most_common():
        click.echo(f"    {t:10s} {b / 2**20:10.1f} MiB")


def engine_options(f):
    """The GPU engine's options (ignored by the CPU reference): KV cache type, VRAM budget and
    the activation path. Shared by gen and serve; `engine_kwargs` turns them into Engine(...)
    arguments."""
    # the names of cache.kv.KV_CACHE_KINDS, written out: importing the cache module here would
    # load numba for `bw24nb --help` (tests/test_kv_cache.py keeps the two lists equal)
    f = click.option("--kv-cache", type=click.Choice(["f16", "q8"]), default="f16",
                     help="KV cache: f16 = K and V in F16 (default), q8 = K in Q8_0 + V in "
                          "Q5_1 (about half the memory).")(f)
    f = click.option("--vram-budget", type=click.FloatRange(0.0, min_open=True), default=None,
                     metavar="GIB", help="Refuse to load if weights + KV cache exceed this many "
                                         "GiB (default: what the device has free).")(f)
    f = click.option("--act-quant", type=click.Choice(["q8", "f32"]), default="q8",
                     help="Activations of matvecs on integer weights: q8 = int8 + dp4a "
                          "(default, llama.cpp's way), f32 = float (the reference's arithmetic).")(f)
    f = click.option("--prefill", "prefill_path", type=click.Choice(["auto", "gemm", "rows"]),
                     default="auto",
                     help="Prefill kernels: gemm = int8 tensor-core GEMM over 512-token chunks "
                          "(fast); rows = the decode kernels over 128-token chunks, so prefill "
                          "gives exactly decode's bits (slower on dense models); auto (default) "
                          "= rows for models with int8 MoE blocks, whose routers turn the "
                          "GEMM's rounding into other experts, gemm for the rest.")(f)
    return f


def engine_kwargs(kv_cache, vram_budget, act_quant, prefill_path="auto") -> dict:
    from .cache.kv import KV_CACHE_KINDS
    k_type, v_type = KV_CACHE_KINDS[kv_cache]
    return dict(k_type=k_type, v_type=v_type, act_quant=act_quant, prefill_path=prefill_path,
                vram_budget=None if vram_budget is None else int(vram_budget * 2**30))


@main.command()
@click.argument("model", required=False)
@click.option("--prompt", "-p", default="Write a Python function that reverses a string.",
              help="Prompt text.")
@click.option("--chat/--no-chat", default=False, help="Wrap the prompt in the model's chat template.")
@click.option("--max-tokens", "-n", default=128, type=click.IntRange(1), help="Tokens to generate at most.")
@click.option("--temperature", default=0.0, type=click.FloatRange(0.0), help="0 = greedy.")
@click.option("--top-k", default=0, type=click.IntRange(0), help="Keep the K most likely tokens (0: all).")
@click.option("--top-p", default=1.0, type=click.FloatRange(0.0, 1.0, min_open=True),
              help="Nucleus: smallest set of tokens with this much probability.")
@click.option("--seed", default=None, type=int, help="Sampling seed (same seed, same tokens).")
@click.option("--ctx", default=4096, type=click.IntRange(16), help="Context length (tokens).")
@click.option("--backend", type=click.Choice(["auto", "gpu", "cpu"]), default="auto",
              help="auto: the GPU engine when a GPU is present, else the numpy reference.")
@click.option("--gate/--no-gate", default=True, help="Run the prefill-vs-decode argmax gate first.")
@click.option("--spec-k", default=0, type=click.IntRange(0, 8),
              help="MTP speculative decoding with K drafted tokens (0: off; needs an MTP head).")
@engine_options
def gen(model, prompt, chat, max_tokens, temperature, top_k, top_p, seed, ctx, backend, gate, spec_k,
        kv_cache, vram_budget, act_quant, prefill_path):
    """Generate text from MODEL (default: the pulled default model), streaming it."""
    from . import backends
    from .generate import GenerationStats, argmax_gate, generate
    from .sampling import SamplingParams

    t_start = time.perf_counter()
    path = _model_path(model)
    lm = backends.load(path, n_ctx=ctx, which=backend, log=lambda m: click.echo(m, err=True),
                       engine_options=engine_kwargs(kv_cache, vram_budget, act_quant, prefill_path))
    click.echo(f"backend: {lm.backend.name}; load {lm.load_s:.2f} s", err=True)
    text = lm.tokenizer.apply_chat_template([{"role": "user", "content": prompt}]) if chat else prompt
    ids = lm.tokenizer.encode(text)
    gate_ok = True
    if gate:
        gate_ok, a, b = argmax_gate(lm.backend, ids)
        click.echo("gate: MATCH" if gate_ok else f"gate: MISMATCH (prefill {a} vs decode {b})", err=True)
    if spec_k:
        from .spec import gen_speculative
        gen_speculative(lm, ids, max_tokens, SamplingParams(temperature, top_k, top_p, seed), spec_k,
                        gate=gate, echo=lambda t: click.echo(t, nl=False),
                        err=lambda m: click.echo(m, err=True))
        click.echo()
        return
    stats = GenerationStats()
    first = None
    for piece in generate(lm.backend, lm.tokenizer, ids, max_tokens,
                          SamplingParams(temperature, top_k, top_p, seed), stats=stats):
        if first is None:
            first = time.perf_counter() - t_start
        click.echo(piece, nl=False)
        sys.stdout.flush()
    click.echo()
    note = "" if gate_ok else "  (gate MISMATCH: these numbers don't count)"
    click.echo(f"prompt {stats.prompt_tokens} tok, {stats.prefill_tps:.1f} tok/s; generated "
               f"{stats.completion_tokens} tok, {stats.decode_tps:.1f} tok/s; "
               f"first token {first or 0:.2f} s after start; finish: {stats.finish_reason}{note}",
               err=True)


@main.command()
@click.argument("model", required=False)
@click.option("--host", default="127.0.0.1", help="Address to bind (loopback unless told otherwise).")
@click.option("--port", default=8080, type=click.IntRange(0, 65535))
@click.option("--api-key", default=None, help="Require 'Authorization: Bearer KEY' on every endpoint but /health.")
@click.option("--ctx", default=4096, type=click.IntRange(16), help="Context length (tokens).")
@click.option("--backend", type=click.Choice(["auto", "gpu", "cpu"]), default="auto")
@click.option("--queue-size", default=16, type=click.IntRange(1), help="Requests waiting beyond this get 429.")
@click.option("--model-name", default=None, help="Name served in /v1/models (default: the file's stem).")
@engine_options
def serve(model, host, port, api_key, ctx, backend, queue_size, model_name, kv_cache, vram_budget,
          act_quant, prefill_path):
    """OpenAI-compatible HTTP server (completions, chat completions, SSE streaming)."""
    from .server import run_server
    run_server(_model_path(model), host=host, port=port, api_key=api_key, n_ctx=ctx,
               backend=backend, queue_size=queue_size, model_name=model_name,
               engine_options=engine_kwargs(kv_cache, vram_budget, act_quant, prefill_path))


@main.command("kernel-check")
@click.option("--size", type=click.Choice(["auto", "tiny", "real"]), default="auto",
              help="tiny: simulator-friendly shapes; real: the served models' shapes (needs a "
                   "GPU); auto: real on a GPU, tiny otherwise.")
@click.option("--seed", default=None, type=int, help="Replay a run (default: fresh, printed).")
@click.option("--only", default=None, metavar="PATTERN",
              help="Run only the checks matching these comma-separated globs; '!glob' "
                   "excludes (e.g. 'matvec*,matmul' or '!moe*').")
@click.option("--types", default=None, metavar="TYPES",
              help="Run the per-type checks for these comma-separated weight types only "
                   "(e.g. 'Q4_K,Q6_K'; default: all).")
def kernel_check(size, seed, only, types):
    """Check every GPU kernel against its numpy reference; exit 1 on any failure.

    Fresh random inputs (the seed is printed), poisoned outputs, one table row per kernel, type
    and shape with its max error and the rounding bound it must stay within."""
    from .kernel_check import main as run
    sys.exit(run(size=size, seed=seed, only=only, types=types))


@main.command(context_settings=dict(ignore_unknown_options=True, allow_extra_args=True,
                                    help_option_names=[]))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench(args):
    """Side-by-side benchmark (bw24nb vs torch vs llama-bench): bench/run_bench.py's options
    (`bw24nb bench --help` lists them). Needs the source checkout (bench/ is not installed)."""
    import importlib
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    if not (root / "bench" / "run_bench.py").is_file():
        raise click.ClickException(f"bench/run_bench.py not found beside the package ({root}); "
                                   "run from a source checkout (pip install -e .)")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    sys.exit(importlib.import_module("bench.run_bench").main(list(args)))


def _register_subcommands():
    from .spec import register_cli
    register_cli(main)


_register_subcommands()

if __name__ == "__main__":
    main()
