"""Test setup: without a GPU, run every kernel in numba's CUDA simulator.

This must happen before anything imports numba.cuda, hence at conftest import time.
"""
import ctypes.util
import os

if "NUMBA_ENABLE_CUDASIM" not in os.environ and ctypes.util.find_library("cuda") is None \
        and not os.path.exists("/usr/lib/x86_64-linux-gnu/libcuda.so.1"):
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

import pytest  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


# Fresh random inputs every run (a kernel must be right on any valid input), yet reproducible:
# the session seed is printed in pytest's header; BW24_TEST_SEED=<n> replays a failing run.
# The seed is put into the environment so that pytest-xdist's workers, started after this
# import, draw the same one as the controller whose header printed it.
SESSION_SEED = int(os.environ.setdefault("BW24_TEST_SEED",
                                         str(int.from_bytes(os.urandom(4), "little"))))


def pytest_report_header(config):
    return f"bw24nb: BW24_TEST_SEED={SESSION_SEED}  cudasim={os.environ.get('NUMBA_ENABLE_CUDASIM', '0')}"


@pytest.fixture
def rng(request):
    """A generator per test: session seed mixed with the test's id."""
    import zlib

    import numpy as np
    return np.random.default_rng([SESSION_SEED, zlib.crc32(request.node.nodeid.encode())])


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (setup.cfg): one worker per CPU this process may run on. xdist's own count is
    psutil's physical cores of the host, which inside a container can be many more than the
    cores it is given -- and every worker holds a numba simulator of ~0.5-1 GB."""
    return max(1, len(os.sched_getaffinity(0)))


@pytest.fixture(scope="session")
def int8_heads_hybrid(tmp_path_factory):
    """A tiny qwen35 file whose DeltaNet heads are 32 wide (the fixtures' 16 are no int8
    block): decode then runs the GDN output norm with ssm_out's int8 copy, and the launch
    that folds it into the delta rule."""
    import dataclasses

    from bw24nb.factory import model_config, write_gguf_model
    from bw24nb.formats.config import validate_config
    cfg = dataclasses.replace(
        model_config("qwen3.5-0.8b", layers=4, vocab=256), hidden_size=64,
        intermediate_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
        linear_value_head_dim=32)
    cfg = validate_config(cfg, "tiny int8-head hybrid")
    path = tmp_path_factory.mktemp("gdn32") / "hybrid32.gguf"
    write_gguf_model(str(path), cfg, seed=11, threads=1, log=None)
    return str(path)
