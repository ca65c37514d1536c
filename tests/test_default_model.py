"""The real default model (Qwen2.5-Coder-0.5B-Instruct GGUF) against transformers, and `gen`.

Slow (downloads ~470 MiB on first use, runs a 0.5B model on the CPU):
    python3 -m pytest -m slow tests/test_default_model.py

transformers is the independent implementation: `from_pretrained(..., gguf_file=...)`
dequantizes the same GGUF to float32 with its own code (gguf-py's dequantizers, its own name
mapping), so agreement checks our codecs, name mapping, tokenizer and layer recipe together.
"""
import re

import numpy as np
import pytest

pytestmark = pytest.mark.slow

PROMPT = ("def quicksort(items):\n    \"\"\"Sort a list of numbers.\"\"\"\n    if len(items) <= 1:\n"
          "        return items\n    pivot = items[len(items) // 2]\n")


@pytest.fixture(scope="module")
def model_path():
    from bw24nb.pull import pull
    return str(pull(log=lambda m: None))


def test_logits_match_transformers(model_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("accelerate")    # transformers needs it to load a GGUF
    transformers = pytest.importorskip("transformers")
    import os

    from bw24nb.reference import load_reference
    from bw24nb.tokenizer import Tokenizer

    ours, source = load_reference(model_path)
    tok = Tokenizer.from_gguf_metadata(source.metadata)
    ids = tok.encode(PROMPT)
    assert len(ids) >= 32
    logits = ours.prefill(ids)

    hf = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(model_path), gguf_file=os.path.basename(model_path),
        torch_dtype=torch.float32)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].numpy()

    # top-1 at every position, and logits within 1e-3 of the largest reference logit: both
    # sides compute in float32 from the same dequantized weights; only summation order differs
    assert (logits.argmax(-1) == ref.argmax(-1)).all()
    rel = np.abs(logits - ref).max() / np.abs(ref).max()
    assert rel <= 1e-3, rel


def test_gen_chat_writes_working_python(model_path):
    from click.testing import CliRunner

    from bw24nb.cli import main

    result = CliRunner().invoke(main, ["gen", model_path, "--backend", "cpu", "--chat", "--no-gate",
                                       "-n", "120", "--prompt",
                                       "Write a Python function that reverses a string."])
    assert result.exit_code == 0, result.output
    code = re.search(r"```python\n(.*?)```", result.output, re.S)
    assert code, result.output
    namespace = {}
    exec(code.group(1), namespace)  # the model's own code, run in a fresh namespace
    fn = namespace[re.search(r"def (\w+)\(", code.group(1)).group(1)]
    assert fn("hello, world") == "dlrow ,olleh"
