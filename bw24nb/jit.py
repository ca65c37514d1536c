"""`@kernel`: ``cuda.jit`` for kernels, with every compiled kernel kept on disk.

Numba compiles a kernel (typing, NVVM, ptxas) at its first launch in every process; with ~40
kernels that made `bw24nb gen`'s first token 17.5 s late on an H200. A kernel defined with
``@kernel`` instead of ``@cuda.jit`` stores its cubin the first time and, in later processes,
loads it (no typing, no NVVM, no ptxas)::

    from ..jit import kernel

    @kernel                       # or @kernel(fastmath=True): any cuda.jit option
    def add(x, y, out): ...

    add[grid, block, stream](x, y, out)    # it *is* a numba CUDADispatcher: launches,
                                           # compiles and captures into graphs as before

Device functions stay ``@cuda.jit(device=True)``: they are compiled into their callers.

Where: ``$BW24_KERNEL_CACHE`` (default ``~/.cache/bw24nb/kernels``), one folder per kernel
module; ``BW24_KERNEL_CACHE=off`` (or ``0``) turns the cache off. Both are read when a kernel
is defined, i.e. when its module is imported. Deleting the folder is always safe.

A stored kernel is used only when all of these match (anything else compiles afresh):
  * the sources: the kernel's module and every bw24nb module it imports, transitively, plus
    the .ptx files beside them (``sources_hash``) -- a kernel inlines device functions from
    other modules, so its own file's timestamp (what numba's ``cache=True`` checks) is not
    enough;
  * the kernel itself: its bytecode, the values it closes over (a factory's weight layout,
    device functions, constants) and its cuda.jit options (``code_key``);
  * the argument types, the GPU's compute capability, the CUDA runtime version, and the
    numba-cuda / numba / Python versions.
So a kernel's module-level constants must come from its source and the GPU only (not from
environment variables read at import). A cache entry that cannot be read or loaded is
dropped and the kernel compiled again. Why this and not plain ``cache=True``:
docs/decisions/0007-kernel-disk-cache.md.

Every kernel begins with ``grid_dependency_wait()`` (``griddepcontrol.wait``, bw24nb/ptx): the
kernel is compiled as a wrapper that waits, then runs the function as an inlined device
function. So any graph of bw24nb kernels may link them with programmatic edges (graph.py):
a kernel's blocks may then be launched while its predecessor still runs, and they touch no
memory before the predecessor has completed. One place, so no kernel can forget it. (The
body is a device-function call, which numba compiles by asking for the current device:
compile_ptx on a machine without a GPU needs tests/test_compile_ptx.py's stand-in device.)
The one exception, ``@kernel(own_wait=True)``: the body calls ``grid_dependency_wait()`` itself,
after reading only memory that no kernel of its graph writes (a decode step's token position,
written by the previous replay's last kernel; cache rows of earlier tokens, named to L2) --
so those round trips overlap the predecessor's run (decode_attention.ONEPASS_PRE_WAIT).

Under numba's CUDA simulator ``@kernel`` is plain ``cuda.jit`` (nothing is compiled, and
launches run one after another anyway).
"""
from __future__ import annotations

import dataclasses
import enum
import hashlib
import inspect
import os
import re
import types as pytypes
import warnings
from functools import lru_cache
from pathlib import Path

import numpy as np
from numba import cuda

from .device import simulator_enabled

ENV = "BW24_KERNEL_CACHE"
DEFAULT_DIR = Path("~/.cache/bw24nb/kernels")
_OFF = {"0", "off", "false", "no"}
_PACKAGE_DIR = Path(__file__).resolve().parent

KERNELS: list = []      # every dispatcher made by `kernel` in this process (for `cache_stats`)


def cache_dir() -> Path | None:
    """The kernel cache folder from $BW24_KERNEL_CACHE, or None when the cache is off."""
    value = os.environ.get(ENV, "").strip()
    if value.lower() in _OFF:
        return None
    return Path(value or DEFAULT_DIR).expanduser()


_GPU_ONLY = ("max_registers",)


def kernel(fn=None, own_wait: bool = False, **options):
    """``cuda.jit(fn, **options)`` for a kernel, with the on-disk cache attached; own_wait: fn
    calls grid_dependency_wait() itself (the module docstring says when that is allowed)."""
    if fn is None:                                  # used as @kernel(...)
        return lambda f: kernel(f, own_wait=own_wait, **options)
    if options.get("device"):
        raise TypeError("@kernel is for kernels; keep device functions @cuda.jit(device=True)")
    if simulator_enabled():
        # options only the GPU compiler knows (the simulator's jit refuses them)
        return cuda.jit(fn, **{k: v for k, v in options.items() if k not in _GPU_ONLY})
    dispatcher = cuda.jit(waiting_kernel(fn, wait=not own_wait), **options)
    KERNELS.append(dispatcher)
    root = cache_dir()
    if root is not None:
        try:
            dispatcher._cache = DiskCache(dispatcher.py_func, dispatcher.targetoptions)
        except Exception as e:   # an unwritable folder must not stop the engine: just compile
            _warn_once(f"bw24nb: kernel cache at {root} unusable ({type(e).__name__}: {e}); "
                       f"kernels will be compiled in every process")
    return dispatcher


def waiting_kernel(fn, wait: bool = True):
    """A function with fn's name, module and parameters that runs
    ``grid_dependency_wait(); fn(...)`` (without wait: ``fn(...)``, which waits itself), fn
    compiled as a device function that NVVM inlines (forceinline). The wrapper is made by a
    generated factory so that fn and the intrinsic are closure cells: `code_key` then
    describes them, fn's code and closure included."""
    from .ptx import grid_dependency_wait
    params = list(inspect.signature(fn).parameters.values())
    if any(p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) or p.default is not p.empty
           for p in params):
        raise TypeError(f"@kernel {fn.__qualname__}: kernels take plain positional parameters")
    names = ", ".join(p.name for p in params)
    src = (f"def _make(_wait, _body):\n"
           f"    def {fn.__name__}({names}):\n"
           + ("        _wait()\n" if wait else "")
           + f"        _body({names})\n"
           f"    return {fn.__name__}\n")
    scope: dict = {}
    exec(compile(src, fn.__code__.co_filename, "exec"), scope)
    inline = {} if simulator_enabled() else {"forceinline": True}    # (the simulator has none)
    wrapper = scope["_make"](grid_dependency_wait, cuda.jit(device=True, **inline)(fn))
    wrapper.__code__ = wrapper.__code__.replace(co_firstlineno=fn.__code__.co_firstlineno)
    wrapper.__module__, wrapper.__qualname__, wrapper.__doc__ = (fn.__module__, fn.__qualname__,
                                                                 fn.__doc__)
    return wrapper


CLUSTER_MAX = 8     # blocks a thread-block cluster may hold on any GPU that has them (portable)
CLUSTER_MAX_NON_PORTABLE = 16   # ... on the H100 / H200 with the kernel's non-portable opt-in


def launch_cluster(dispatcher, grid, block, cluster: int, stream, *args,
                   non_portable: bool = False) -> None:
    """``dispatcher[grid, block, stream](*args)`` with its blocks grouped into thread-block
    clusters of `cluster` consecutive blocks along x (sm_90+; 1 .. CLUSTER_MAX, grid[0] a
    multiple of it; non_portable: up to CLUSTER_MAX_NON_PORTABLE, the kernel's
    CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED set first, which only some GPUs can
    schedule -- the H100 / H200, a cluster a GPC): what ``dispatcher[...]`` does (the kernel
    compiled, or loaded from the disk cache, for the arguments' types, and its arguments marshalled), launched through
    cuda.core with a cluster dimension (cuLaunchKernelEx). Captured into a graph like any launch. numba-cuda has no
    launch option for clusters, so this reaches into its launch path (`_Kernel._prepare_args`,
    the compiled kernel's cufunc): numba-cuda 0.30."""
    from numba.cuda.errors import normalize_kernel_dimensions

    grid, block = normalize_kernel_dimensions(grid, block)      # numba's own launch does this
    n = int(cluster)
    top = CLUSTER_MAX_NON_PORTABLE if non_portable else CLUSTER_MAX
    if not 1 <= n <= top:
        raise ValueError(f"launch_cluster: clusters of 1 .. {top} blocks "
                         f"({'non-portable' if non_portable else 'portable'}), not {n}")
    if grid[0] % n:
        raise ValueError(f"launch_cluster: grid {grid} is not whole clusters of {n} blocks")
    if simulator_enabled():
        raise RuntimeError("launch_cluster: the simulator runs no clusters (launch a block a "
                           "cluster, as the kernels' callers do there)")
    from cuda.core import LaunchConfig, launch
    from numba.cuda.cudadrv import driver

    kern = dispatcher.compile(tuple(dispatcher.typeof_pyval(a) for a in args))
    core_stream = driver._to_core_stream(stream)
    kernelargs, retr = [], []
    for ty, value in zip(kern.argument_types, args):
        kern._prepare_args(ty, value, core_stream, retr, kernelargs)
    config = LaunchConfig(grid=(grid[0] // n, grid[1], grid[2]), cluster=(n, 1, 1), block=block)
    cufunc = kern._codelibrary.get_cufunc()
    if n > CLUSTER_MAX:
        # as numba's own set_shared_memory_carveout sets a kernel attribute (cuKernelSetAttribute)
        from numba.cuda.cudadrv.driver import binding
        attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
        driver.driver.cuKernelSetAttribute(attr, 1, cufunc.handle, cufunc.device.id)
    launch(core_stream, config, cufunc.kernel, *kernelargs)
    for writeback in retr:
        writeback()


def cache_stats() -> dict:
    """Disk-cache hits and misses (= compilations) of this process's kernels so far."""
    hits = sum(sum(d.stats.cache_hits.values()) for d in KERNELS)
    misses = sum(sum(d.stats.cache_misses.values()) for d in KERNELS)
    return {"hits": hits, "misses": misses, "dir": str(cache_dir()), "kernels": len(KERNELS)}


# ---------------------------------------------------------------- what a kernel depends on


def _module_file(name: str) -> Path | None:
    """The source file of bw24nb module `name` (a package's __init__.py), if there is one."""
    parts = name.split(".")
    if parts[0] != _PACKAGE_DIR.name:
        return None
    base = _PACKAGE_DIR.joinpath(*parts[1:])
    candidates = [base / "__init__.py"] if len(parts) == 1 else [base.with_suffix(".py"),
                                                                  base / "__init__.py"]
    return next((c for c in candidates if c.is_file()), None)


# `from .x import (a, b)` / `import x.y as z` at the start of a line (a regex, not ast: this
# runs on the way to the first token, and an extra match, e.g. in a docstring, only adds a file)
_IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#]*)"
                     r"|import[ \t]+([^\n#]+))", re.M)


@lru_cache(maxsize=None)
def _imports(path: Path, module: str) -> tuple[str, ...]:
    """The modules that `path` (module `module`) imports anywhere in its text, relative imports
    resolved. ``from P import a`` counts as importing P.a where that is a module, else P."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = []
    for dots, mod, imported, plain in _IMPORT.findall(path.read_text()):
        if plain:
            names += [n.split()[0] for n in plain.split(",") if n.strip()]
            continue
        if dots:
            parts = package.split(".")
            base = ".".join(parts[:len(parts) - len(dots) + 1])
            mod = f"{base}.{mod}" if mod else base
        subs = [f"{mod}.{n.split()[0]}" for n in imported.strip("()").split(",") if n.strip()]
        modules = [m for m in subs if _module_file(m)]
        names += modules if len(modules) == len(subs) else modules + [mod]
    return tuple(names)


def dependency_files(module: str, path: Path | None = None) -> list[Path]:
    """`module`'s file (or `path`), every bw24nb module it imports, transitively, and the
    .ptx files in those modules' folders (bw24nb/ptx reads its snippets from them)."""
    start = _module_file(module) or path
    files, todo = {}, [(module, start)]
    while todo:
        name, file = todo.pop()
        if file is None or file in files:
            continue
        files[file] = name
        todo += [(n, _module_file(n)) for n in _imports(file, name)]
    for folder in {f.parent for f in files}:
        files.update((p, "") for p in folder.glob("*.ptx"))
    return sorted(files)


@lru_cache(maxsize=None)
def sources_hash(module: str, path: Path | None = None) -> str:
    """sha256 over the files of `dependency_files` (their paths inside bw24nb and bytes)."""
    h = hashlib.sha256()
    for f in dependency_files(module, path):
        name = f.relative_to(_PACKAGE_DIR) if f.is_relative_to(_PACKAGE_DIR) else f.name
        data = f.read_bytes()
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def _describe(v, path: tuple = ()) -> str:
    """A text that is the same in every process for the same value, and differs between the
    values a kernel can close over (numbers, enums, layouts, device functions, intrinsics).
    Object addresses never enter it: an unknown object gives its type and repr, and if that
    repr holds an address the key changes each run -- a cache miss, never a wrong hit."""
    if v is None or isinstance(v, (bool, int, float, complex, str, bytes, np.generic, enum.Enum)):
        return repr(v)
    if isinstance(v, np.ndarray):
        return f"ndarray({v.dtype}, {v.shape}, {hashlib.sha256(v.tobytes()).hexdigest()})"
    if isinstance(v, pytypes.ModuleType):
        return f"module {v.__name__}"
    if id(v) in path:                                   # a function reaching itself
        return f"<recursive {type(v).__qualname__}>"
    path = path + (id(v),)
    if isinstance(v, (tuple, list, set, frozenset)):
        items = [_describe(x, path) for x in v]
        if isinstance(v, (set, frozenset)):
            items.sort()
        return f"{type(v).__name__}({', '.join(items)})"
    if isinstance(v, dict):
        items = sorted(f"{_describe(k, path)}: {_describe(x, path)}" for k, x in v.items())
        return "{" + ", ".join(items) + "}"
    if isinstance(v, pytypes.CodeType):
        consts = ", ".join(_describe(c, path) for c in v.co_consts)
        return f"code({v.co_code.hex()}, [{consts}], {v.co_names})"
    if isinstance(v, pytypes.FunctionType):
        cells = ", ".join(_describe(c.cell_contents, path) for c in v.__closure__ or ())
        return f"fn {v.__module__}.{v.__qualname__}({_describe(v.__code__, path)}, [{cells}])"
    inner = getattr(v, "__wrapped__", None)    # numba dispatchers and @intrinsics wrap a function
    if isinstance(inner, pytypes.FunctionType):
        return f"{type(v).__name__}[{_describe(inner, path)}]"
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        fields = {f.name: getattr(v, f.name) for f in dataclasses.fields(v)}
        return f"{type(v).__qualname__}{_describe(fields, path)}"
    if type(v).__repr__ is object.__repr__ and hasattr(v, "__dict__"):   # plain object: Layout
        return f"{type(v).__qualname__}{_describe(vars(v), path)}"
    return f"{type(v).__module__}.{type(v).__qualname__}:{v!r}"


def code_key(py_func, options: dict | None = None) -> str:
    """sha256 of the kernel function (bytecode, closed-over values) and its cuda.jit options."""
    text = _describe(py_func) + "|" + _describe(dict(options or {}))
    return hashlib.sha256(text.encode()).hexdigest()


_warned: set = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


# ---------------------------------------------------------------- numba's cache, keyed our way

if not simulator_enabled():
    import numba
    import numba_cuda
    from numba.cuda.core import sigutils
    from numba.cuda.core.caching import _CacheLocator
    from numba.cuda.dispatcher import CUDACache, CUDACacheImpl

    class _Locator(_CacheLocator):
        """<cache_dir()>/<kernel's module>/; an entry is fresh while sources_hash is unchanged."""

        def __init__(self, py_func, py_file):
            self._dir = cache_dir() / py_func.__module__
            self._lineno = py_func.__code__.co_firstlineno
            self._stamp = sources_hash(py_func.__module__, Path(py_file).resolve())

        @classmethod
        def from_function(cls, py_func, py_file):
            locator = cls(py_func, py_file)
            locator.ensure_cache_path()         # raises OSError if it cannot write there
            return locator

        def get_cache_path(self):
            return str(self._dir)

        def get_source_stamp(self):
            return self._stamp

        def get_disambiguator(self):
            return str(self._lineno)

    class _Impl(CUDACacheImpl):
        _locator_classes = [_Locator]

    class DiskCache(CUDACache):
        """numba-cuda's kernel cache (an index file and data files of pickled kernels holding
        their cubins, written atomically) with our folder, freshness stamp and key, and with
        an entry that cannot be read or loaded treated as a miss instead of an error."""

        _impl_class = _Impl

        def __init__(self, py_func, targetoptions: dict):
            self._code_key = code_key(py_func, targetoptions)
            self._qualname = py_func.__qualname__
            super().__init__(py_func)

        def _index_key(self, sig, codegen):
            argtypes = sigutils.normalize_signature(sig)[0]
            key = (repr(tuple(argtypes)), codegen.magic_tuple(),   # (CUDA runtime, cc)
                   numba_cuda.__version__, numba.__version__, self._code_key)
            if self._launch_config_key is not None:              # as CUDACache._index_key
                key += (("launch_config", self._launch_config_key),)
            return key

        def load_overload(self, sig, target_context):
            try:
                kernel = super().load_overload(sig, target_context)
                if kernel is not None:
                    kernel.bind()        # load the cubin now: a bad one is a miss, not a crash
                return kernel
            except Exception as e:
                _warn_once(f"bw24nb: kernel cache entry of {self._qualname} unusable "
                           f"({type(e).__name__}: {e}); compiling it again")
                try:
                    self.flush()         # a fresh index, so that the recompiled kernel is stored
                except OSError:
                    pass
                return None

        def save_overload(self, sig, data):
            try:
                super().save_overload(sig, data)
            except Exception as e:       # e.g. a kernel linking a .ptx file: numba can't pickle it
                _warn_once(f"bw24nb: kernel {self._qualname} not stored in the kernel cache "
                           f"({type(e).__name__}: {e})")
