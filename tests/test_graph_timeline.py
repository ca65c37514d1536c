"""bench/graph_timeline.py's host side, without a GPU: Numba's mangled kernel names, splitting
a trace into steps, and the per-kernel gap / inc / idle arithmetic on hand-made timelines."""
import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.graph_timeline import kernel_name, split_steps, step_rows, summarize  # noqa: E402


def test_kernel_name_reads_numba_mangling():
    # the form numba-cuda gives a kernel (seen in compile_ptx's .entry): module, name, two
    # ABI tags, E, argument types
    m = ("_ZN8__main__12my_kernel_r4B2v1B92cw51cXTLSUwv1sDUaKthqaNgoKmjgOR3W3CwAkMXLaJtQYkOIgx"
         "JU0gCqOkEJoHkbttqdVhoqlspQGNFHSgJ5BnXagIAE5ArrayIfLi1E1C7mutable7alignedE")
    assert kernel_name(m) == "my_kernel_r4"
    assert kernel_name("_ZN6cudapy6bw24nb7kernels6matvec20q4k_persist_w4_p1_r4B2v1E5Arr") \
        == "q4k_persist_w4_p1_r4"
    assert kernel_name("void cutlass::Kernel<foo>(int)") == "void cutlass::Kernel<foo>(int)"


def test_split_steps_on_long_gaps_only():
    a = [("k", 0.0, 5.0), ("k", 6.0, 9.0), ("k", 8.0, 20.0)]         # overlap, short gaps
    b = [("k", 3000.0, 3010.0), ("k", 3011.0, 3012.0)]
    rnd = random.Random(1)
    ks = a + b
    rnd.shuffle(ks)
    steps = split_steps(ks, gap_us=1500.0)
    assert [len(s) for s in steps] == [3, 2]
    # a gap is measured from the latest end so far, not from the previous kernel's end: a
    # short kernel inside a long one opens no step
    steps = split_steps([("long", 0, 4000), ("short", 1, 2), ("next", 3900, 4100)], 1500.0)
    assert len(steps) == 1


def test_step_rows_gaps_incs_and_idle():
    # A 0..10, B starts early under a programmatic edge (5..14), C after a 6-us gap, D beside
    # C on a branch, ending first
    step = [("A", 100.0, 110.0), ("B", 105.0, 114.0), ("C", 120.0, 130.0), ("D", 121.0, 125.0)]
    rows, tot = step_rows(step)
    got = {r["name"]: r for r in rows}
    assert [r["name"] for r in rows] == ["A", "B", "C", "D"]
    assert got["A"]["start"] == 0.0 and got["A"]["inc"] == 10.0
    assert got["B"]["gap"] == -5.0 and got["B"]["inc"] == 4.0 and got["B"]["dur"] == 9.0
    assert got["C"]["gap"] == 6.0 and got["C"]["inc"] == 10.0
    assert got["D"]["gap"] == -9.0 and got["D"]["inc"] == 0.0          # hidden behind C
    assert tot["span"] == 30.0 and tot["busy"] == 24.0 and tot["idle"] == 6.0
    assert sum(r["inc"] for r in rows) == pytest.approx(tot["busy"])
    assert sum(max(0.0, r["gap"]) for r in rows) == pytest.approx(tot["idle"])


def test_incs_partition_the_busy_time_of_random_timelines():
    rnd = random.Random(7)
    for _ in range(50):
        step, t = [], 0.0
        for i in range(rnd.randint(1, 30)):
            t += rnd.uniform(-3.0, 4.0)
            step.append((f"k{i % 4}", t, t + rnd.uniform(0.1, 8.0)))
        rows, tot = step_rows(step)
        # busy = the measure of the union of the intervals, computed independently
        iv = sorted((s, e) for _, s, e in step)
        union, cur = 0.0, None
        for s, e in iv:
            if cur is None or s > cur[1]:
                union += 0.0 if cur is None else cur[1] - cur[0]
                cur = [s, e]
            else:
                cur[1] = max(cur[1], e)
        union += cur[1] - cur[0]
        assert tot["busy"] == pytest.approx(union)
        assert sum(r["inc"] for r in rows) == pytest.approx(union)
        assert sum(max(0.0, r["gap"]) for r in rows) == pytest.approx(tot["idle"])
        assert tot["span"] == pytest.approx(max(e for _, _, e in step) - min(s for _, s, _ in step))


def test_summarize_takes_medians_per_name():
    s1 = [("A", 0, 10), ("B", 12, 20)]
    s2 = [("A", 0, 12), ("B", 13, 20)]
    s3 = [("A", 0, 11), ("C", 11, 15)]                 # B missing: counts 0 in this step
    totals, per = summarize([s1, s2, s3])
    assert totals["span"] == 20 and totals["idle"] == 1 and totals["busy"] == 18   # each a median of its own
    assert per["A"]["inc"] == 11 and per["A"]["launches"] == 1
    assert per["B"]["inc"] == 7 and per["B"]["gap"] == 1       # median of 8, 7, 0 / 2, 1, 0
    assert per["C"]["launches"] == 0
    assert list(per)[0] == "A"                                  # the largest inc first


def test_short_name_and_the_offline_report(tmp_path, capsys):
    from bench.graph_timeline import read_csv, report, short_name
    assert short_name("bw24nb::kernels::norm::rms_norm_q8_rows[abi:v7][abi:cw51c](Array<float, 1>)") \
        == "norm::rms_norm_q8_rows"
    assert short_name("bw24nb::cache::kv::kv_store_rope[abi:v298]") == "cache::kv::kv_store_rope"
    import gzip
    path = tmp_path / "t.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write("mode,step,i,name,start_us,end_us\n")
        for step, (a, b) in enumerate([(10.0, 4.0), (12.0, 6.0), (11.0, 5.0)]):
            f.write(f"m,{step},0,mv::matvec_x,0,{a}\n")
            f.write(f"m,{step},1,norm::n,{a - 1},{a + b}\n")
    steps = read_csv(path)["m"]
    assert [len(s) for s in steps] == [2, 2, 2] and steps[1][0] == ("mv::matvec_x", 0.0, 12.0)
    report([path])
    out = capsys.readouterr().out
    assert "span 16.0 us, busy 16.0, idle 0.0" in out              # medians of 14, 18, 16
    assert "matvecs: 11.0 us of the busy 16.0 (68.8 %)" in out


def test_read_csv_keeps_a_repeated_mode_apart(tmp_path):
    from bench.graph_timeline import read_csv
    path = tmp_path / "t.csv"
    lines = ["mode,step,i,name,start_us,end_us"]
    for mode, end in (("a", 5), ("b", 6), ("a", 7)):
        lines += [f"{mode},0,0,k,0,{end}", f"{mode},1,0,k,0,{end}"]
    path.write_text("\n".join(lines) + "\n")
    got = read_csv(path)
    assert sorted(got) == ["a", "a#2", "b"]
    assert [len(s) for s in got["a"]] == [1, 1] and got["a#2"][0] == [("k", 0.0, 7.0)]
