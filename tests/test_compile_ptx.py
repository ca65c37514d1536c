"""Every kernel compiles to PTX for sm_90 (H200) and sm_120 (RTX 50xx), no GPU needed.

Each module of ``bw24nb/kernels/`` (and ``bw24nb/ptx/probes.py``) declares
``PTX_SIGNATURES = {"kernel_name": ["numba signature", ...]}``; optionally
``EXPECTED_PTX = {"kernel_name": ["text the PTX must contain", ...]}`` and
``LINKS = {"kernel_name": ["file.ptx in bw24nb/ptx", ...]}``.

``numba.cuda.compile_ptx`` does not exist in the simulator, so the compiling happens in a
subprocess with ``NUMBA_ENABLE_CUDASIM`` unset — this very file run as a script. Besides the text
checks, each PTX is *assembled* for its target with nvJitLink (the PTX-to-SASS step a driver
would do, with the same toolkit version as the NVVM that wrote the PTX), which catches bad inline
asm, a wrong operand type, an instruction the target lacks, or a linked ``.func`` whose prototype
does not match its ``cuda.declare_device`` signature.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CCS = [(9, 0), (12, 0)]
PROBES = "bw24nb.ptx.probes"
# The compile worker runs every signature for both targets in one process: 1550 s of CI's
# 64-minute run in session 29 (its slowest item by 4x), so 1800 s was a spurious failure away.
# Alone (session 30, 2 cores): 949 s, of which 862 s compiling for sm_90 (numba's typing and
# lowering of each kernel), 48 s for sm_120 (the same kernels again: the front end's work is
# reused) and 37 s assembling with nvJitLink. CI's other worker keeps the second core busy,
# so splitting the worker over processes would not shorten CI.
WORKER_TIMEOUT_S = 3600


def _kernel_modules() -> list[str]:
    mods = [PROBES]
    for path in sorted((ROOT / "bw24nb" / "kernels").glob("*.py")):
        if path.name != "__init__.py":
            mods.append(f"bw24nb.kernels.{path.stem}")
    return mods


MODULES = _kernel_modules()


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("compile_ptx") / "result.json"
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    proc = subprocess.run([sys.executable, __file__, str(out), *MODULES], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=WORKER_TIMEOUT_S)
    if proc.returncode != 0 or not out.exists():
        pytest.fail(f"compile worker failed (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    result = json.loads(out.read_text())
    if not result["nvvm"]:
        pytest.skip(f"no NVVM to compile with: {result['nvvm_error']} "
                    "(pip install 'numba-cuda[cu13]')")
    return result


@pytest.mark.parametrize("module", MODULES)
def test_module_declares_ptx_signatures(compiled, module):
    info = compiled["modules"][module]
    assert info.get("import_error") is None, f"{module} does not import:\n{info['import_error']}"
    assert info["declares"], f"{module} defines kernels but no PTX_SIGNATURES dict"
    assert not info["unknown"], f"PTX_SIGNATURES of {module} names no kernel: {info['unknown']}"
    assert not info["missing"], (f"kernels of {module} without an entry in PTX_SIGNATURES "
                                 f"(tests/test_compile_ptx.py cannot check them): {info['missing']}")


@pytest.mark.parametrize("cc", CCS, ids=lambda cc: f"sm_{cc[0]}{cc[1]}")
@pytest.mark.parametrize("module", MODULES)
def test_module_compiles_and_assembles(compiled, module, cc):
    info = compiled["modules"][module]
    if info.get("import_error") is not None:
        pytest.fail(f"{module} does not import")
    results = [r for r in info["results"] if tuple(r["cc"]) == cc]
    if not results:
        pytest.skip(f"{module} declares no signatures")
    problems = []
    for r in results:
        where = f"{r['kernel']}{r['sig']}"
        if r["error"]:
            problems.append(f"{where}: compile_ptx failed: {r['error']}")
            continue
        if r["target"] != f"sm_{cc[0]}{cc[1]}":
            problems.append(f"{where}: .target {r['target']}")
        if r["missing_text"]:
            problems.append(f"{where}: PTX lacks {r['missing_text']}")
        if r["assemble_error"]:
            problems.append(f"{where}: nvJitLink could not assemble it: {r['assemble_error']}")
    assert not problems, "\n".join(problems)


def test_probe_kernels_carry_their_instructions(compiled):
    # The ptx probes must be checked for their instruction text, not only compiled.
    results = compiled["modules"][PROBES]["results"]
    assert {r["kernel"] for r in results} >= {"dp4a_kernel", "mma_kernel", "fp4_kernel",
                                              "ld_nc_v4_kernel", "dp4a_linked_kernel"}
    for r in results:
        assert r["expected_text"], f"{r['kernel']}: no EXPECTED_PTX entry"


def test_native_fp4_cvt_compiles_for_arch_specific_targets(compiled):
    native = compiled["native_fp4"]
    for arch in ("sm_100a", "sm_120a"):
        r = native[arch]
        assert r["error"] is None, r["error"]
        assert "cvt.rn.f16x2.e2m1x2" in r["instructions"]
        assert r["assemble_error"] is None, r["assemble_error"]


def test_assembler_check_is_real(compiled):
    # Negative controls: the assembly step above must be able to fail.
    controls = compiled["controls"]
    assert controls["cvt_e2m1x2_on_sm_90"], "nvJitLink accepted cvt.rn.f16x2.e2m1x2 for sm_90"
    assert controls["linked_without_its_ptx"], "nvJitLink resolved bw24nb_dp4a_s32 from nowhere"


def test_system_ptxas_accepts_sm90_ptx(compiled):
    """The toolkit's ptxas (CUDA 13.0 here and on the H200) on the probes' sm_90 PTX."""
    ptxas = shutil.which("ptxas") or "/usr/local/cuda/bin/ptxas"
    if not Path(ptxas).exists():
        pytest.skip("no ptxas on this machine")
    version = subprocess.run([ptxas, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release (\d+)\.(\d+)", version)
    ptx_isa = tuple(compiled["ptx_isa"])
    # ptxas of CUDA 13.x accepts PTX ISA <= 9.x with x = minor release (13.0 -> 9.0).
    accepted = (9, int(m.group(2))) if m and int(m.group(1)) == 13 else None
    if accepted is None or ptx_isa > accepted:
        build = version.strip().splitlines()[-1] if version.strip() else "?"
        pytest.skip(f"NVVM wrote PTX ISA {ptx_isa[0]}.{ptx_isa[1]}; {ptxas} ({build}) accepts at "
                    f"most {accepted}: assembled with the matching nvJitLink instead")
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in compiled["probe_ptx_sm90"].items():
            path = Path(tmp) / f"{name}.ptx"
            path.write_text(text)
            proc = subprocess.run([ptxas, "-arch=sm_90", "-c" if "linked" in name else "-O3",
                                   str(path), "-o", str(path.with_suffix(".cubin"))],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                failures.append(f"{name}: {proc.stderr.strip()}")
    assert not failures, "\n".join(failures)


# --- the worker (runs in a subprocess without the simulator) --------------------------------------

def _assemble(ptx_texts: list[str], arch: str) -> str | None:
    """None if nvJitLink links these PTX modules into a cubin for ``arch``, else its error log."""
    from bw24nb.ptx.offline import link_ptx

    return link_ptx(ptx_texts, arch)[1]


def _target(ptx: str) -> str | None:
    m = re.search(r"^\.target\s+(\w+)", ptx, re.M)
    return m.group(1) if m else None


def _allow_compiling_without_gpu() -> None:
    from bw24nb.ptx.offline import allow_compiling_without_gpu

    allow_compiling_without_gpu()


def _compile(dispatcher, sig, cc):
    from bw24nb.ptx.offline import compile_ptx

    return compile_ptx(dispatcher, sig, cc)


def _worker(out_path: str, modules: list[str]) -> None:
    import importlib
    import traceback

    result = {"nvvm": True, "nvvm_error": None, "modules": {}, "native_fp4": {}, "controls": {},
              "probe_ptx_sm90": {}, "ptx_isa": None}
    try:
        from numba.cuda.cudadrv import nvvm
        nvvm.NVVM()
    except Exception as exc:  # no libnvvm: nothing below can run
        result.update(nvvm=False, nvvm_error=f"{type(exc).__name__}: {exc}")
        Path(out_path).write_text(json.dumps(result))
        return

    from numba.cuda.dispatcher import CUDADispatcher

    _allow_compiling_without_gpu()

    from bw24nb.ptx.snippets import ptx_path

    for name in modules:
        info = {"import_error": None, "declares": False, "unknown": [], "missing": [], "results": []}
        result["modules"][name] = info
        try:
            mod = importlib.import_module(name)
        except Exception:
            info["import_error"] = traceback.format_exc()
            continue
        # A kernel object may sit under several names (a loop variable left over from building a
        # table of kernels, say): it is covered when any of its names has signatures.
        names_of: dict[int, list[str]] = {}
        for k, v in vars(mod).items():
            if isinstance(v, CUDADispatcher) and not v.targetoptions.get("device") \
                    and getattr(v.py_func, "__module__", None) == name:
                names_of.setdefault(id(v), []).append(k)
        kernels = bool(names_of)
        sigs = getattr(mod, "PTX_SIGNATURES", None)
        info["declares"] = isinstance(sigs, dict) or not kernels
        sigs = sigs if isinstance(sigs, dict) else {}
        expected = getattr(mod, "EXPECTED_PTX", {})
        links = getattr(mod, "LINKS", {})
        info["unknown"] = sorted(k for k in sigs
                                 if not isinstance(getattr(mod, k, None), CUDADispatcher))
        info["missing"] = sorted(min(ks, key=lambda k: (k.startswith("_"), k))
                                 for ks in names_of.values() if not set(ks) & set(sigs))
        for kname in sorted(set(sigs) - set(info["unknown"])):
            for sig in sigs[kname]:
                for cc in CCS:
                    # every @kernel waits for its predecessors first (bw24nb/jit.py)
                    waits = ["griddepcontrol.wait"] if name.startswith("bw24nb.kernels") else []
                    r = {"kernel": kname, "sig": sig, "cc": cc, "error": None, "target": None,
                         "expected_text": expected.get(kname, []) + waits, "missing_text": [],
                         "assemble_error": None}
                    info["results"].append(r)
                    try:
                        ptx = _compile(getattr(mod, kname), sig, cc)
                    except Exception as exc:
                        r["error"] = f"{type(exc).__name__}: {exc}"
                        continue
                    r["target"] = _target(ptx)
                    r["missing_text"] = [t for t in r["expected_text"] if t not in ptx]
                    linked = [Path(ptx_path(f)).read_text() for f in links.get(kname, [])]
                    r["assemble_error"] = _assemble([ptx] + linked, f"sm_{cc[0]}{cc[1]}")
                    if name == "bw24nb.ptx.probes" and cc == (9, 0):
                        result["probe_ptx_sm90"][kname] = ptx
                        m = re.search(r"^\.version\s+(\d+)\.(\d+)", ptx, re.M)
                        result["ptx_isa"] = [int(m.group(1)), int(m.group(2))]

    # The native FP4 conversion, which only arch-specific targets have.
    from numba import cuda

    from bw24nb.ptx.asm import FP4_CVT

    cvt_f16x2, cvt_f32x2, _ = FP4_CVT

    def native_fp4(out_h, out_f, codes):
        i = cuda.grid(1)
        if i < codes.size:
            out_h[i] = cvt_f16x2(codes[i])
            lo, hi = cvt_f32x2(codes[i])
            out_f[2 * i] = lo
            out_f[2 * i + 1] = hi

    sig = "void(uint32[::1], float32[::1], uint8[::1])"
    for arch, cc in (("sm_100a", (10, 0, "a")), ("sm_120a", (12, 0, "a"))):
        r = {"error": None, "instructions": [], "assemble_error": None}
        result["native_fp4"][arch] = r
        try:
            ptx, _ = cuda.compile_ptx(native_fp4, sig, cc=cc)
        except Exception as exc:
            r["error"] = f"{type(exc).__name__}: {exc}"
            continue
        r["instructions"] = sorted(set(re.findall(r"\b(cvt\.[\w.]+)", ptx)))
        r["assemble_error"] = _assemble([ptx], arch)

    # Negative controls for the assembly step.
    ptx90, _ = cuda.compile_ptx(native_fp4, sig, cc=(9, 0))
    result["controls"]["cvt_e2m1x2_on_sm_90"] = _assemble([ptx90], "sm_90") is not None
    from bw24nb.ptx import probes
    ptx_linked, _ = cuda.compile_ptx(probes.dp4a_linked_kernel.py_func,
                                     probes.PTX_SIGNATURES["dp4a_linked_kernel"][0], cc=(9, 0))
    result["controls"]["linked_without_its_ptx"] = _assemble([ptx_linked], "sm_90") is not None

    Path(out_path).write_text(json.dumps(result))


if __name__ == "__main__":
    os.environ.pop("NUMBA_ENABLE_CUDASIM", None)
    sys.path.insert(0, str(ROOT))
    _worker(sys.argv[1], sys.argv[2:])
