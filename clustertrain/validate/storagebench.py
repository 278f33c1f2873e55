"""Storage benchmark: sequential write/read throughput and metadata rates per mount.

Throughput uses ``fio --output-format=json`` when fio is installed (``engine="auto"`` or ``"fio"``):
a sequential write job (1 MiB blocks, ``end_fsync=1``) then a sequential read job of the same file
(fio drops the file's page cache before reading, ``invalidate=1``). Without fio, or with
``engine="python"``, a built-in Python loop does the same (write + fsync; ``posix_fadvise
DONTNEED`` before reading). Metadata (create / stat / unlink per second) is always measured with
the Python loop: fio has no portable metadata test. Each target gets a private work directory
``.clustertrain-bench-<pid>`` that is removed afterwards.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from clustertrain.validate.results import StorageResult, StorageRun, ValidateError
from clustertrain.validate.storageparse import load_json_output, parse_fio_json

_MIB = 1024 * 1024


class StorageBenchConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    size_mib: int = Field(default=256, ge=1, description="Bytes written then read per target, MiB.")
    block_kib: int = Field(default=1024, ge=4, description="I/O block size, KiB.")
    files: int = Field(default=1000, ge=1, description="Files created/stat'ed/unlinked for the metadata rates.")
    engine: Literal["auto", "fio", "python"] = Field(default="auto", description="Throughput engine; auto = fio if installed.")
    timeout_s: float = Field(default=600.0, gt=0, description="Limit for one fio run, seconds.")


def _mount_of(path: Path) -> tuple[str | None, str | None]:
    best, fstype = "", None
    try:
        for line in open("/proc/mounts"):
            parts = line.split()
            if len(parts) >= 3 and (str(path) == parts[1] or str(path).startswith(parts[1].rstrip("/") + "/")) \
                    and len(parts[1]) >= len(best):
                best, fstype = parts[1], parts[2]
    except OSError:
        pass
    return best or None, fstype


def _fio(args: list[str], timeout: float) -> dict:
    p = subprocess.run(["fio", "--output-format=json", *args], capture_output=True, text=True, timeout=timeout)
    obj = load_json_output(p.stdout)
    if p.returncode != 0 or obj is None:
        raise ValidateError(f"fio failed (exit {p.returncode}): {(p.stderr or p.stdout).strip().splitlines()[-1:]}")
    return obj


def _fio_throughput(work: Path, cfg: StorageBenchConfig, res: StorageResult) -> None:
    common = [f"--directory={work}", "--filename=seq.dat", f"--size={cfg.size_mib}M", f"--bs={cfg.block_kib}k",
              "--ioengine=psync", "--direct=0", "--numjobs=1"]
    w = parse_fio_json(_fio(["--name=seqwrite", "--rw=write", "--end_fsync=1", *common], cfg.timeout_s))
    r = parse_fio_json(_fio(["--name=seqread", "--rw=read", "--invalidate=1", *common], cfg.timeout_s))
    if w.failed or r.failed:
        raise ValidateError(f"fio reported errors: {'; '.join(w.problems + r.problems)}")
    res.write_mib_s = w.results[0].write_mib_s
    res.read_mib_s = r.results[0].read_mib_s
    res.ops.update({f"fio_{k}": v for k, v in {**w.results[0].ops, **r.results[0].ops}.items()})
    res.notes.append(f"throughput: fio ({w.results[0].notes[0]}), psync, {cfg.block_kib} KiB blocks, {cfg.size_mib} MiB")


def _python_throughput(work: Path, cfg: StorageBenchConfig, res: StorageResult) -> None:
    path = work / "seq.dat"
    block = os.urandom(cfg.block_kib * 1024)
    total = cfg.size_mib * _MIB
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        written = 0
        while written < total:
            written += os.write(fd, block[: min(len(block), total - written)])
        os.fsync(fd)
    finally:
        os.close(fd)
    res.write_mib_s = total / _MIB / (time.perf_counter() - t0)
    fd = os.open(path, os.O_RDONLY)
    try:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        t0 = time.perf_counter()
        got = 0
        while chunk := os.read(fd, len(block)):
            got += len(chunk)
    finally:
        os.close(fd)
    res.read_mib_s = got / _MIB / (time.perf_counter() - t0)
    res.notes.append(f"throughput: python (write+fsync, fadvise DONTNEED then read), {cfg.block_kib} KiB blocks, "
                     f"{cfg.size_mib} MiB")


def _metadata(work: Path, cfg: StorageBenchConfig, res: StorageResult) -> None:
    d = work / "md"
    d.mkdir()
    names = [str(d / f"f{i:07d}") for i in range(cfg.files)]
    t0 = time.perf_counter()
    for n in names:
        os.close(os.open(n, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    t1 = time.perf_counter()
    for n in names:
        os.stat(n)
    t2 = time.perf_counter()
    for n in names:
        os.unlink(n)
    t3 = time.perf_counter()
    res.create_per_s, res.stat_per_s, res.unlink_per_s = (cfg.files / max(b - a, 1e-9) for a, b in ((t0, t1), (t1, t2), (t2, t3)))
    res.notes.append(f"metadata: python, {cfg.files} files in one directory, one process")


def run_storage_bench(paths: list[str | Path], cfg: StorageBenchConfig | None = None) -> StorageRun:
    """Benchmark each path (a directory on the mount to test)."""
    cfg = cfg or StorageBenchConfig()
    have_fio = shutil.which("fio") is not None
    if cfg.engine == "fio" and not have_fio:
        raise ValidateError("engine 'fio' asked for but fio is not installed; apt-get install -y fio, or use engine python")
    engine = "fio" if (cfg.engine == "fio" or (cfg.engine == "auto" and have_fio)) else "python"
    run = StorageRun(tool=engine)
    if engine == "python" and cfg.engine == "auto":
        run.warnings.append("fio not installed: throughput measured with the built-in Python fallback")
    for p in paths:
        path = Path(p).expanduser().resolve()
        if not path.is_dir():
            raise ValidateError(f"{p}: not a directory; give a directory on the mount to benchmark")
        if not os.access(path, os.W_OK):
            raise ValidateError(f"{p}: not writable; the benchmark writes {cfg.size_mib} MiB there")
        mount, fstype = _mount_of(path)
        usage = shutil.disk_usage(path)
        res = StorageResult(target=str(path), tool=engine, fs_type=fstype, free_bytes=usage.free)
        if mount:
            res.notes.append(f"mount {mount}")
        if usage.free < cfg.size_mib * _MIB * 1.1:
            run.problems.append(f"{path}: only {usage.free // _MIB} MiB free, need {cfg.size_mib} MiB")
            run.results.append(res)
            continue
        work = path / f".clustertrain-bench-{os.getpid()}"
        work.mkdir(exist_ok=False)
        try:
            if engine == "fio":
                _fio_throughput(work, cfg, res)
            else:
                _python_throughput(work, cfg, res)
            _metadata(work, cfg, res)
        except (OSError, subprocess.TimeoutExpired, ValidateError) as e:
            run.problems.append(f"{path}: {e}")
        finally:
            shutil.rmtree(work, ignore_errors=True)
        run.results.append(res)
    run.failed = bool(run.problems)
    return run
