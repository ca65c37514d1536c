"""`bw24nb kernel-check` (bw24nb/kernel_check.py): the tiny suite passes in the simulator, every
kernel launcher is exercised by a check, and the table really fails when a kernel is wrong.

The suite runs once per check (seeded from the `rng` fixture, so `BW24_TEST_SEED` replays it;
the seed is also in the failure message) with every `launch_*` function of bw24nb.kernels.*
and bw24nb.cache.* wrapped to record its calls: a launcher that no check calls -- a new
kernel without a check -- fails CI here.
"""
import re

import numpy as np
from click.testing import CliRunner

from bw24nb import kernel_check as kc
from bw24nb.cli import main as cli

SUMMARY = re.compile(r"^kernel-check: (\d+) passed, (\d+) failed$")


def _record_launchers(monkeypatch, calls):
    """Wrap every launcher in its module so that calls through the module are recorded."""
    import importlib
    for key, fn in kc.launcher_names().items():
        mod_name, attr = key.rsplit(".", 1)
        mod = importlib.import_module(f"bw24nb.{mod_name}")

        def wrapper(*a, _fn=fn, _key=key, **kw):
            calls.add(_key)
            return _fn(*a, **kw)

        monkeypatch.setattr(mod, attr, wrapper)


def _table(rows):
    return "\n".join([kc.TABLE_HEADER] + [kc.format_row(r) for r in rows])


def test_tiny_suite_passes_and_covers_every_launcher(monkeypatch, rng):
    launchers = set(kc.launcher_names())
    declared = {name for c in kc.REGISTRY.values() for name in c.covers}
    unknown = declared - launchers
    assert not unknown, f"checks name launchers that do not exist: {unknown}"
    assert not launchers - declared, (f"kernel launchers without a kernel-check (add a @check "
                                      f"for them in bw24nb/kernel_check.py): "
                                      f"{sorted(launchers - declared)}")
    calls = set()
    _record_launchers(monkeypatch, calls)
    seed = int(rng.integers(0, 2 ** 32))
    rows, not_called = [], {}
    for c in kc.REGISTRY.values():
        calls.clear()
        got = kc.run_checks("tiny", seed, only=c.name)
        assert got, f"check {c.name} produced no rows"
        rows += got
        missing = set(c.covers) - calls
        if missing:
            not_called[c.name] = sorted(missing)
    failed = [r for r in rows if not r.passed]
    assert not failed, f"kernel-check failures (replay: bw24nb kernel-check --size tiny " \
                       f"--seed {seed}):\n{_table(rows)}"
    assert not not_called, f"checks that never call the launchers they declare: {not_called}"


def _run_cli(*args):
    result = CliRunner().invoke(cli, ["kernel-check", "--size", "tiny", *args])
    lines = result.output.strip().splitlines()
    return result, lines


def test_cli_table_and_summary_line():
    result, lines = _run_cli("--only", "add,advance", "--seed", "5")
    assert result.exit_code == 0, result.output
    assert "seed 5" in lines[0]
    assert lines[1].split()[:3] == ["kernel", "type", "shape"]
    assert all(line.rstrip().endswith("PASS") for line in lines[2:-2])
    m = SUMMARY.match(lines[-1])
    assert m and m.groups() == ("3", "0"), lines[-1]


def test_a_wrong_kernel_makes_the_table_fail_and_exit_1(monkeypatch):
    from bw24nb.kernels import activation

    def writes_zeros(a, b, out, stream=0):
        out.copy_to_device(np.zeros(out.shape, np.float32))

    monkeypatch.setattr(activation, "launch_add", writes_zeros)
    result, lines = _run_cli("--only", "add", "--seed", "3")
    assert result.exit_code == 1, result.output
    assert "FAIL" in result.output and "bytes differ" in result.output
    assert SUMMARY.match(lines[-1]).groups() == ("0", "1")


def test_zero_tolerance_fails_a_float_path_but_not_an_exact_one(monkeypatch):
    # With the rounding bounds scaled to 0, a float32 kernel compared with a float64 reference
    # must fail (its errors are real and nonzero), while the bit-exact paths still pass: the
    # bounds, not luck, decide PASS.
    monkeypatch.setattr(kc, "MARGIN", 0.0)
    monkeypatch.setattr(kc, "TINY_NORMAL", 0.0)
    rows = kc.run_checks("tiny", 11, only="rms_norm,add")
    by_kernel = {r.kernel: r for r in rows}
    assert not by_kernel["rms_norm"].passed and by_kernel["rms_norm"].ratio == np.inf
    assert "outside the bound" in by_kernel["rms_norm"].detail
    assert by_kernel["add"].passed


def test_unwritten_outputs_are_reported(monkeypatch):
    from bw24nb.kernels import activation
    monkeypatch.setattr(activation, "launch_swiglu", lambda g, u, y, stream=0: None)
    rows = kc.run_checks("tiny", 2, only="swiglu")
    swiglu = next(r for r in rows if r.kernel == "swiglu")
    assert not swiglu.passed and "unwritten" in swiglu.detail


def test_a_crashing_kernel_is_a_fail_row_and_the_run_goes_on(monkeypatch):
    from bw24nb.kernels import step

    def boom(*a, **kw):
        raise RuntimeError("launch failed")

    monkeypatch.setattr(step, "launch_advance", boom)
    errors = []
    rows = kc.run_checks("tiny", 1, only="advance,add", on_error=lambda n, tb: errors.append(n))
    assert [(r.kernel, r.passed) for r in rows] == [("add", True), ("advance", False)]
    assert "RuntimeError: launch failed" in rows[1].detail and errors == ["advance"]


def test_seed_replays_the_same_inputs():
    a = kc.run_checks("tiny", 1234, only="rms_norm")
    b = kc.run_checks("tiny", 1234, only="rms_norm")
    assert [r.max_abs for r in a] == [r.max_abs for r in b] and a[0].max_abs > 0


def test_only_selects_by_globs_and_exclusions():
    names = lambda only: [c.name for c in kc.select(only)]          # noqa: E731
    assert names("matvec*,add") == ["matvec", "matvec_q8", "matvec_q6k_r", "matvec_rows", "add"]
    rest = names("!matvec*,!add")
    assert "matvec" not in rest and "add" not in rest and "add_rms_norm" in rest
    assert names(None) == list(kc.REGISTRY) and names("no_such*") == []


def test_cli_refuses_real_shapes_without_a_gpu_and_unknown_patterns():
    result = CliRunner().invoke(cli, ["kernel-check", "--size", "real"])
    assert result.exit_code == 2 and "needs a GPU" in result.output
    result, _ = _run_cli("--only", "no_such_kernel*")
    assert result.exit_code == 2 and "no kernel check matches" in result.output



def test_types_selects_the_per_type_checks_weight_types():
    """--types runs the per-type checks for the named weight types only (the real-size run of
    every type is too long for one device call), and an unknown name is an error, not an
    empty run."""
    result, lines = _run_cli("--only", "matvec_q8,matvec_rows", "--types", "q4_k", "--seed", "5")
    assert result.exit_code == 0, result.output
    types = {line[27:41].strip() for line in lines if line.startswith("matvec_q8")}  # the column
    assert types == {"Q4_K"}, result.output
    assert SUMMARY.match(lines[-1]).groups()[1] == "0"
    assert kc.TYPES == frozenset({"Q4_K"})
    result, _ = _run_cli("--only", "matvec_q8", "--types", "Q9_Z")
    assert result.exit_code == 2 and "unknown weight types ['Q9_Z']" in result.output
    kc.TYPES = None
