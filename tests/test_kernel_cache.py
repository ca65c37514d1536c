"""The kernel disk cache (bw24nb/jit.py): `@kernel` is transparent, and a stored kernel is used
only when its sources, closed-over values, options, argument types and GPU all match.

Two halves:
  * in this process (the simulator on a machine without a GPU): `@kernel` kernels run, launch
    on streams and replay from a CudaGraph like `@cuda.jit` ones; the source and code keys;
  * the `real_*` functions below, which need numba-cuda's real dispatcher (not the simulator's):
    this file run as a script in a subprocess without NUMBA_ENABLE_CUDASIM (no GPU needed --
    nothing is compiled; a stand-in kernel object goes through the cache's store and load).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
import warnings
from pathlib import Path

import numpy as np
import pytest
from numba import cuda

from bw24nb import jit
from bw24nb.jit import code_key, kernel

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- in-process (simulator or GPU)


def _make_scale(factor):
    """A factory kernel closing over a device function and a constant, as matvec.py does."""
    @cuda.jit(device=True)
    def times(v):
        return v * factor

    def scale(x, out):
        i = cuda.grid(1)
        if i < x.size:
            out[i] = times(x[i])

    return kernel(scale)


def test_kernel_runs_like_cuda_jit(rng):
    def axpy(a, x, y, out):
        i = cuda.grid(1)
        if i < x.size:
            out[i] = a * x[i] + y[i]

    n = int(rng.integers(40, 200))
    x, y = rng.standard_normal((2, n)).astype(np.float32)
    results = []
    for jit in (cuda.jit, kernel, kernel(fastmath=False)):
        out = cuda.to_device(np.full(n, np.nan, np.float32))
        stream = cuda.stream()
        jit(axpy)[(n + 31) // 32, 32, stream](np.float32(2.5), cuda.to_device(x), cuda.to_device(y), out)
        stream.synchronize()
        results.append(out.copy_to_host())
    np.testing.assert_array_equal(results[0], np.float32(2.5) * x + y)
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])


def test_factory_kernels_keep_their_closures(rng):
    x = rng.standard_normal(37).astype(np.float32)
    for factor in (2.0, -3.0):
        out = cuda.to_device(np.full(x.size, np.nan, np.float32))
        _make_scale(np.float32(factor))[2, 32](cuda.to_device(x), out)
        np.testing.assert_array_equal(out.copy_to_host(), x * np.float32(factor))


def test_kernel_is_capturable_into_a_graph(rng):
    from bw24nb.graph import CudaGraph

    k = _make_scale(np.float32(2.0))
    stream = cuda.stream()
    x = cuda.to_device(np.ones(64, np.float32), stream=stream)
    k[2, 32, stream](x, x)                       # first launch (compiles) outside the capture
    with CudaGraph.capture(stream) as graph:
        k[2, 32, stream](x, x)
    stream.synchronize()
    assert np.all(x.copy_to_host() == 2.0)       # captured, not run
    graph.replay()
    graph.replay()
    stream.synchronize()
    assert np.all(x.copy_to_host() == 8.0)


def test_kernel_refuses_device_functions():
    with pytest.raises(TypeError, match="device"):
        kernel(device=True)(lambda x: x)


def test_waiting_wrapper_waits_first_unless_the_kernel_waits_itself():
    """Every @kernel's wrapper calls grid_dependency_wait() before its body; with own_wait
    (a body that waits itself, after reads no kernel of its graph writes) it only calls the
    body, and the two wrappers' keys differ."""
    def body(y):
        y[0] = 1.0

    waits = jit.waiting_kernel(body)
    own = jit.waiting_kernel(body, wait=False)
    assert set(waits.__code__.co_freevars) == {"_wait", "_body"}
    assert own.__code__.co_freevars == ("_body",)
    assert own.__name__ == waits.__name__ == "body"
    assert code_key(waits) != code_key(own)


def test_cache_dir_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(jit.ENV, raising=False)
    assert jit.cache_dir() == Path("~/.cache/bw24nb/kernels").expanduser()
    monkeypatch.setenv(jit.ENV, str(tmp_path / "k"))
    assert jit.cache_dir() == tmp_path / "k"
    for off in ("off", "0", "OFF", "false"):
        monkeypatch.setenv(jit.ENV, off)
        assert jit.cache_dir() is None


@pytest.fixture
def fake_package(tmp_path, monkeypatch):
    """A package named bw24nb in tmp_path: a imports b (relative) and the snippet folder."""
    pkg = tmp_path / "bw24nb"
    (pkg / "ptx").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "a.py": "import numpy as np\nfrom .b import helper\nfrom .ptx import (\n    snippet,\n)\n",
        "b.py": "def helper():\n    return 1\n",
        "c.py": "x = 1\n",
        "ptx/__init__.py": "from .text import snippet\n",
        "ptx/text.py": "snippet = 'dp4a'\n",
        "ptx/dp4a.ptx": "// dp4a\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    monkeypatch.setattr(jit, "_PACKAGE_DIR", pkg)
    jit._imports.cache_clear()
    jit.sources_hash.cache_clear()
    yield pkg
    jit._imports.cache_clear()
    jit.sources_hash.cache_clear()


def test_dependencies_follow_imports_transitively(fake_package):
    deps = {str(p.relative_to(fake_package)) for p in jit.dependency_files("bw24nb.a")}
    assert deps == {"a.py", "b.py", "ptx/__init__.py", "ptx/text.py", "ptx/dp4a.ptx"}


@pytest.mark.parametrize("edit, changes", [("b.py", True), ("ptx/text.py", True),
                                           ("ptx/dp4a.ptx", True), ("a.py", True),
                                           ("c.py", False)])
def test_source_hash_changes_with_any_dependency(fake_package, edit, changes):
    before = jit.sources_hash("bw24nb.a")
    with open(fake_package / edit, "a") as f:
        f.write("# edited\n")
    jit._imports.cache_clear()
    jit.sources_hash.cache_clear()
    assert (jit.sources_hash("bw24nb.a") != before) == changes


def test_real_kernels_depend_on_the_modules_they_inline():
    # What numba's own cache=True misses: matvec inlines dequant's decoders and ptx's snippets.
    deps = {str(p.relative_to(jit._PACKAGE_DIR)) for p in jit.dependency_files("bw24nb.kernels.matvec")}
    assert {"kernels/matvec.py", "kernels/dequant.py", "ptx/warp.py", "ptx/asm.py",
            "ptx/dp4a.ptx", "jit.py"} <= deps
    # ... while a kernel module that imports nothing of bw24nb's kernels stays independent
    deps = {str(p.relative_to(jit._PACKAGE_DIR)) for p in jit.dependency_files("bw24nb.kernels.norm")}
    assert "kernels/matvec.py" not in deps and "kernels/norm.py" in deps


def test_code_key_sees_closures_code_and_options():
    def factory(c, dev):
        def k(x):
            x[0] = dev(c)
        return k

    inc = cuda.jit(device=True)(lambda v: v + 1)
    dec = cuda.jit(device=True)(lambda v: v - 1)
    base = code_key(factory(1, inc))
    assert code_key(factory(1, inc)) == base                     # same values, same key
    assert code_key(factory(2, inc)) != base                     # another constant
    assert code_key(factory(np.float32(1), inc)) != base         # another constant type
    assert code_key(factory(1, dec)) != base                     # another device function
    assert code_key(factory(1, inc), {"fastmath": True}) != base  # another option

    def k2(x):
        x[0] = 2
    assert code_key(k2) != code_key(factory(2, inc))


def test_code_key_survives_self_reference():
    def outer():
        def rec(n):
            return rec(n - 1) if n else 0
        return rec

    assert code_key(outer()) == code_key(outer())


# ---------------------------------------------------------------- real numba-cuda, in a subprocess


def _run_worker(*args, env_extra=None, timeout=600):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    env.update(env_extra or {})
    proc = subprocess.run([sys.executable, __file__, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"worker failed (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def real_results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kernel_cache")
    return _run_worker("checks", str(tmp), env_extra={"BW24_KERNEL_CACHE": str(tmp / "cache")})


REAL_CHECKS = ["real_kernel_gets_the_disk_cache", "real_cache_off_switch",
               "real_unwritable_cache_dir_is_not_fatal", "real_index_key",
               "real_store_and_load", "real_corrupt_files_are_misses"]


@pytest.mark.parametrize("name", REAL_CHECKS)
def test_real(real_results, name):
    result = real_results.get(name)
    if result == "no numba-cuda dispatcher":
        pytest.skip(result)
    assert result == "ok", result


def test_every_kernel_key_is_the_same_in_every_process(tmp_path):
    """numba's own cache=True hashes a pickle of the closure, which holds each @intrinsic's
    per-process uuid: the dp4a kernels would never hit. Ours must be stable, and distinct."""
    env = {"BW24_KERNEL_CACHE": str(tmp_path / "cache")}
    first = _run_worker("keys", env_extra=env)
    second = _run_worker("keys", env_extra=env)
    if first.get("skip"):
        pytest.skip(first["skip"])
    assert len(first["keys"]) >= 40
    assert first["keys"] == second["keys"]
    assert len(set(first["keys"].values())) == len(first["keys"])
    assert first["caches"] == ["DiskCache"]


# The real_* checks: plain functions of (tmp folder), run by the worker below.

class _Codegen:
    def __init__(self, cc):
        self.cc = cc

    def magic_tuple(self):
        return ((13, 0), self.cc)


class _Module:
    initialized = True


class _CuFunc:
    module = _Module()


class _Library:
    """Stands in for a compiled CUDACodeLibrary: what a loaded kernel's bind() touches."""

    def __init__(self, cubin_ok=True):
        self.cubin_ok = cubin_ok

    def get_cufunc(self):
        if not self.cubin_ok:
            raise RuntimeError("CUDA_ERROR_INVALID_IMAGE")
        return _CuFunc()


class _CompiledKernel:
    """What DiskCache.save_overload receives from numba: reducible to _Kernel._rebuild's args."""

    def __init__(self, name, cc=(9, 0), cubin_ok=True):
        self.name, self.codegen, self.cubin_ok = name, _Codegen(cc), cubin_ok

    def _reduce_states(self):
        return dict(cooperative=False, name=self.name, signature=None,
                    codelibrary=_Library(self.cubin_ok), debug=False, lineinfo=False,
                    call_helper=None, extensions=[])


class _TargetContext:
    def __init__(self, cc=(9, 0)):
        self.cc = cc

    def refresh(self):
        pass

    def codegen(self):
        return _Codegen(self.cc)


def _sample(x):
    x[0] = 1


def real_kernel_gets_the_disk_cache(tmp):
    from bw24nb.jit import DiskCache

    k = kernel(_sample)
    assert isinstance(k._cache, DiskCache)
    assert Path(k._cache.cache_path) == jit.cache_dir() / __name__
    assert Path(k._cache.cache_path).is_dir()
    assert k in jit.KERNELS


def real_cache_off_switch(tmp):
    from numba.cuda.core.caching import NullCache

    os.environ["BW24_KERNEL_CACHE"], saved = "off", os.environ["BW24_KERNEL_CACHE"]
    try:
        k = kernel(_sample)
    finally:
        os.environ["BW24_KERNEL_CACHE"] = saved
    assert isinstance(k._cache, NullCache)


def real_unwritable_cache_dir_is_not_fatal(tmp):
    from numba.cuda.core.caching import NullCache

    blocker = Path(tmp) / "a_file"
    blocker.write_text("not a folder")
    os.environ["BW24_KERNEL_CACHE"], saved = str(blocker / "cache"), os.environ["BW24_KERNEL_CACHE"]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            k = kernel(_sample)
    finally:
        os.environ["BW24_KERNEL_CACHE"] = saved
    assert isinstance(k._cache, NullCache)
    assert any("unusable" in str(w.message) for w in caught)


def real_index_key(tmp):
    cache = kernel(_sample)._cache
    sig = "void(float32[::1])"
    h100, h200 = _Codegen((9, 0)), _Codegen((12, 0))
    assert cache._index_key(sig, h100) != cache._index_key(sig, h200)          # architecture
    assert cache._index_key(sig, h100) != cache._index_key("void(float64[::1])", h100)
    from numba.cuda.core import sigutils
    argtypes = sigutils.normalize_signature(sig)[0]
    assert cache._index_key(argtypes, h100) == cache._index_key(sig, h100)     # str or types

    def _sample_changed(x):
        x[0] = 2
    _sample_changed.__qualname__ = _sample.__qualname__
    other = kernel(_sample_changed)._cache
    assert other._index_key(sig, h100) != cache._index_key(sig, h100)          # its code


def real_store_and_load(tmp):
    cache = kernel(_sample)._cache
    sig = "void(float32[::1])"
    assert cache.load_overload(sig, _TargetContext()) is None
    cache.save_overload(sig, _CompiledKernel("stored_for_sm90"))
    loaded = cache.load_overload(sig, _TargetContext())
    assert loaded is not None and loaded.entry_name == "stored_for_sm90"
    assert cache.load_overload(sig, _TargetContext((12, 0))) is None           # other GPU
    # a new process sees the same entry: a fresh cache object on the same function
    assert kernel(_sample)._cache.load_overload(sig, _TargetContext()).entry_name == "stored_for_sm90"


def real_corrupt_files_are_misses(tmp):
    sig = "void(float32[::1])"
    cache = kernel(_sample)._cache
    cache.save_overload(sig, _CompiledKernel("good"))
    folder = Path(cache.cache_path)
    index = next(folder.glob("*.nbi"))
    data = next(folder.glob("*.nbc"))
    for victim, garbage in ((data, b"\x80\x04garbage"), (data, b""), (index, b"\x00\xff" * 7)):
        victim.write_bytes(garbage)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert kernel(_sample)._cache.load_overload(sig, _TargetContext()) is None
        assert caught, f"no warning for a corrupt {victim.suffix}"
        cache.save_overload(sig, _CompiledKernel("recompiled"))           # stored again
        assert cache.load_overload(sig, _TargetContext()).entry_name == "recompiled"
    # a cubin the driver refuses is a miss too (and is then replaced)
    cache.save_overload(sig, _CompiledKernel("bad cubin", cubin_ok=False))
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert cache.load_overload(sig, _TargetContext()) is None


def _worker_checks(tmp):
    results = {}
    try:
        from numba.cuda.dispatcher import CUDACache  # noqa: F401
    except ImportError:
        return {name: "no numba-cuda dispatcher" for name in REAL_CHECKS}
    for name in REAL_CHECKS:
        try:
            globals()[name](tmp)
            results[name] = "ok"
        except Exception:
            results[name] = traceback.format_exc()
    return results


def _worker_keys():
    import importlib

    from bw24nb.kernels import KERNEL_MODULES

    for m in list(KERNEL_MODULES) + ["bw24nb.cache.kv", "bw24nb.cache.recurrent"]:
        importlib.import_module(m)
    keys = {}
    for d in jit.KERNELS:
        f = d.py_func
        keys[f"{f.__module__}.{f.__qualname__}:{f.__code__.co_firstlineno}"] = \
            jit.code_key(f, d.targetoptions)
    return {"keys": keys, "caches": sorted({type(d._cache).__name__ for d in jit.KERNELS})}


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    if sys.argv[1] == "checks":
        print(json.dumps(_worker_checks(sys.argv[2])))
    else:
        print(json.dumps(_worker_keys()))
