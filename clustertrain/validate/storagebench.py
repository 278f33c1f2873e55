"""Storage benchmark: sequential write/read throughput and metadata rates per mount.

Throughput uses ``fio --output-format=json`` when fio is installed (``engine="auto"`` or ``"fio"``):
a sequential write job (1 MiB blocks, ``end_fsync=1``) then a sequential read job of the same file.
Without fio, or with ``engine="python"``, a built-in Python loop does the same. Metadata (create /
stat / unlink per second) is always measured with the Python loop: fio has no portable metadata
test. Each target gets a private work directory ``.clustertrain-bench-<pid>`` that is removed afterwards.

The page cache must not serve the figures (a read of a file just written comes from memory). How it
is kept out (:func:`cache_method`, recorded in ``StorageResult.cache_bypass``), first that applies:

* ``direct`` — the file system takes ``O_DIRECT`` (probed with an aligned 4 KiB write; Lustre, ext4,
  xfs do): fio ``--direct=1``, or ``O_DIRECT`` with page-aligned buffers in Python;
* ``drop_caches`` — ``sync`` then ``3 > /proc/sys/vm/drop_caches`` between write and read (root only);
* ``larger_than_ram`` — the file is larger than the node's memory (``--size``);
* ``none`` — only ``posix_fadvise(DONTNEED)`` (fio ``invalidate=1``): a best effort that a file system
  may ignore; the run carries a warning and the suite marks the read figure ``warn``.

``cache="direct" | "drop" | "buffered"`` forces one (``buffered`` = ``none``).
"""

from __future__ import annotations

import mmap
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Literal

import psutil
from pydantic import Field

from clustertrain.core.schema import StrictModel
from clustertrain.validate.results import StorageResult, StorageRun, ValidateError
from clustertrain.validate.storageparse import load_json_output, parse_fio_json

_MIB = 1024 * 1024


class StorageBenchConfig(StrictModel):
    """How each target is benchmarked (``validate storage`` options, or its ``--config`` file)."""

    size_mib: int = Field(default=256, ge=1, description="Bytes written then read per target, MiB.")
    block_kib: int = Field(default=1024, ge=4, description="I/O block size, KiB.")
    files: int = Field(default=1000, ge=1, description="Files created/stat'ed/unlinked for the metadata rates.")
    engine: Literal["auto", "fio", "python"] = Field(default="auto", description="Throughput engine; auto = fio if installed.")
    timeout_s: float = Field(default=600.0, gt=0, description="Limit for one fio run, seconds.")
    cache: Literal["auto", "direct", "drop", "buffered"] = Field(
        default="auto", description="How to keep the page cache out: auto (O_DIRECT if supported, else drop caches, "
                                    "else a file larger than RAM, else none), direct, drop, buffered.")


DROP_CACHES = "/proc/sys/vm/drop_caches"


def supports_direct(directory: Path) -> bool:
    """True when ``directory``'s file system accepts an aligned ``O_DIRECT`` write."""
    if not hasattr(os, "O_DIRECT"):
        return False
    probe = directory / ".clustertrain-odirect-probe"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o600)
    except OSError:
        return False
    try:
        with mmap.mmap(-1, 4096) as buf:
            return os.write(fd, buf) == 4096
    except OSError:
        return False
    finally:
        os.close(fd)
        probe.unlink(missing_ok=True)


def memory_bytes() -> int | None:
    """The node's memory in bytes; None when it cannot be read."""
    try:
        return int(psutil.virtual_memory().total) or None
    except (OSError, RuntimeError):
        return None


def cache_method(requested: str, direct_ok: bool, can_drop: bool, size_bytes: int, mem_bytes: int | None) -> str:
    """``direct``, ``drop_caches``, ``larger_than_ram`` or ``none`` (see the module docstring)."""
    if requested == "direct" or (requested == "auto" and direct_ok):
        if not direct_ok:
            raise ValidateError("cache 'direct' asked for but this file system refuses O_DIRECT; use cache auto")
        return "direct"
    if requested == "drop" or (requested == "auto" and can_drop):
        if not can_drop:
            raise ValidateError(f"cache 'drop' asked for but {DROP_CACHES} is not writable (root only); use cache auto")
        return "drop_caches"
    if requested == "auto" and mem_bytes and size_bytes > mem_bytes:
        return "larger_than_ram"
    return "none"


def _drop_caches() -> None:
    os.sync()
    with open(DROP_CACHES, "w") as f:
        f.write("3\n")


def _mount_of(path: Path) -> tuple[str | None, str | None]:
    """The mount point holding ``path`` (the longest that is a prefix) and its file system type."""
    best, fstype = "", None
    try:
        parts = psutil.disk_partitions(all=True)
    except OSError:
        return None, None
    for part in parts:
        mp = part.mountpoint
        if (str(path) == mp or str(path).startswith(mp.rstrip("/") + "/")) and len(mp) >= len(best):
            best, fstype = mp, part.fstype
    return best or None, fstype


def _fio(args: list[str], timeout: float) -> dict:
    p = subprocess.run(["fio", "--output-format=json", *args], capture_output=True, text=True, timeout=timeout)
    obj = load_json_output(p.stdout)
    if p.returncode != 0 or obj is None:
        raise ValidateError(f"fio failed (exit {p.returncode}): {(p.stderr or p.stdout).strip().splitlines()[-1:]}")
    return obj


def _fio_throughput(work: Path, cfg: StorageBenchConfig, res: StorageResult, cache: str) -> None:
    common = [f"--directory={work}", "--filename=seq.dat", f"--size={cfg.size_mib}M", f"--bs={cfg.block_kib}k",
              "--ioengine=psync", f"--direct={1 if cache == 'direct' else 0}", "--numjobs=1"]
    w = parse_fio_json(_fio(["--name=seqwrite", "--rw=write", "--end_fsync=1", *common], cfg.timeout_s))
    if cache == "drop_caches":
        _drop_caches()
    r = parse_fio_json(_fio(["--name=seqread", "--rw=read", "--invalidate=1", *common], cfg.timeout_s))
    if w.failed or r.failed:
        raise ValidateError(f"fio reported errors: {'; '.join(w.problems + r.problems)}")
    res.write_mib_s = w.results[0].write_mib_s
    res.read_mib_s = r.results[0].read_mib_s
    res.ops.update({f"fio_{k}": v for k, v in {**w.results[0].ops, **r.results[0].ops}.items()})
    res.notes.append(f"throughput: fio ({w.results[0].notes[0]}), psync, direct={1 if cache == 'direct' else 0}, "
                     f"{cfg.block_kib} KiB blocks, {cfg.size_mib} MiB")


def _python_throughput(work: Path, cfg: StorageBenchConfig, res: StorageResult, cache: str) -> None:
    path = work / "seq.dat"
    direct = os.O_DIRECT if cache == "direct" else 0
    total = cfg.size_mib * _MIB
    with mmap.mmap(-1, cfg.block_kib * 1024) as buf:  # page-aligned: what O_DIRECT needs
        buf.write(os.urandom(len(buf)))
        view = memoryview(buf)
        t0 = time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | direct, 0o600)
        try:
            written = 0
            while written < total:
                written += os.write(fd, view[: min(len(buf), total - written)])
            os.fsync(fd)
        finally:
            os.close(fd)
        res.write_mib_s = total / _MIB / (time.perf_counter() - t0)
        if cache == "drop_caches":
            _drop_caches()
        fd = os.open(path, os.O_RDONLY | direct)
        try:
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            t0 = time.perf_counter()
            got = 0
            while n := os.readv(fd, [view]):
                got += n
        finally:
            os.close(fd)
        view.release()
    res.read_mib_s = got / _MIB / (time.perf_counter() - t0)
    res.notes.append(f"throughput: python (write+fsync then read; {'O_DIRECT' if direct else 'buffered'}), "
                     f"{cfg.block_kib} KiB blocks, {cfg.size_mib} MiB")


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
            direct_ok = supports_direct(work) and cfg.block_kib % 4 == 0
            res.cache_bypass = cache_method(cfg.cache, direct_ok, os.access(DROP_CACHES, os.W_OK),
                                            cfg.size_mib * _MIB, memory_bytes())
            if res.cache_bypass == "none":
                why = "cache 'buffered' asked for" if cfg.cache == "buffered" else "no O_DIRECT, cannot drop caches"
                run.warnings.append(f"{path}: page cache not bypassed ({why}): the read figure may come from memory; "
                                    "run as root or with --size above the node's RAM")
            if engine == "fio":
                _fio_throughput(work, cfg, res, res.cache_bypass)
            else:
                _python_throughput(work, cfg, res, res.cache_bypass)
            _metadata(work, cfg, res)
        except (OSError, subprocess.TimeoutExpired, ValidateError) as e:
            run.problems.append(f"{path}: {e}")
        finally:
            shutil.rmtree(work, ignore_errors=True)
        run.results.append(res)
    run.failed = bool(run.problems)
    return run
