"""Megatron-LM's iteration log lines as rows of ``RUN_DIR/metrics.jsonl`` (what ``status`` and the report read).

Megatron's ranks write no ``metrics.jsonl``: the last rank prints one line per logged iteration
(``training_log`` in ``megatron/training/training.py`` at :data:`~clustertrain.megatron.config.MEGATRON_TAG`)::

     [2026-11-23 10:00:00.123456] iteration      100/    1000 | consumed samples:        12800 | elapsed time per
     iteration (ms): 1234.5 | throughput per GPU (TFLOP/s/GPU): 400.1 | learning rate: 3.000000E-04 | global batch
     size:   128 | lm loss: 2.345678E+00 | loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 |
     number of nan iterations:   0 |

(one line). :func:`parse_line` reads the head with one regular expression — an optional ``N: `` (``srun --label``),
an optional ``[timestamp]`` (with or without microseconds; older releases print none), ``iteration N/ M |`` — and
the rest as ``key: value`` pairs split on ``|``, so a field Megatron adds, drops or moves is no trouble.
:func:`megatron_row` turns one line into a row with the built-in trainer's keys (:mod:`clustertrain.train.metrics`)
and Megatron's own:

===================  ==============================================================================================
row key              from
===================  ==============================================================================================
step                 ``iteration``
loss                 ``lm loss`` (None when the line has none)
lr, grad_norm        ``learning rate``, ``grad norm``
step_time_s          ``elapsed time per iteration (ms)`` / 1000
tokens_per_s         ``global batch size`` x ``model.seq_len`` / step_time_s (the trainer's rule)
mfu                  flops per token (:meth:`clustertrain.core.model_shape.ModelShape.flops_per_token`, the trainer's
                     formula) x tokens_per_s / (the GPU's bf16 peak x GPUs); the peak is the catalog's for
                     ``cluster.instance_type``'s GPU, the GPUs ``nodes_for`` x ``cluster.ranks_per_node``;
                     None without an instance type the catalog knows
tokens               ``consumed samples`` x ``model.seq_len``
time                 the line's timestamp as Unix seconds (read as this machine's local time: Megatron prints the
                     node's clock without a zone), else when it was ingested
consumed_samples,    ``consumed samples``, ``global batch size``, ``throughput per GPU (TFLOP/s/GPU)``,
global_batch,        ``loss scale``, ``number of skipped iterations``, ``number of nan iterations``
tflops_per_gpu,
loss_scale,
skipped_iters,
nan_iters
skipped_samples,     when the line has them: ``skipped samples``, ``energy per GPU (J/iter/GPU)``,
energy_per_gpu_j,    ``power per GPU (W/GPU)``, ``num zeros``, ``params norm``
power_per_gpu_w,
num_zeros,
params_norm
(any other key)      snake case: ``mtp_1 loss`` -> ``mtp_1_loss`` (``megatron_`` + it, should that collide)
framework            ``"megatron"``
===================  ==============================================================================================

A value that is not a finite number (``nan``, ``inf``) is null.

Ingest (:func:`ingest_megatron_log`, run by ``clustertrain status`` and ``report`` before they read
``metrics.jsonl``): the sources (:func:`log_sources`: each Slurm job's output file from ``jobs.jsonl``, oldest job
first, then ``RUN_DIR/logs/rank<R>.log`` of a local run) are read from where the previous ingest stopped, whole lines
only (a line still being written waits for the next call). A row whose step is at or below the last row's means
Megatron resumed from an earlier checkpoint: the rows from that step on are dropped first and ``metrics.jsonl`` is
rewritten atomically, as the built-in trainer does on resume; otherwise the new rows are appended. Two ingests at
once (two ``status`` calls) take turns on an ``fcntl`` lock (``RUN_DIR/monitor/megatron-log.lock``), so no row is
written twice. Nothing new (every source as long as last time) costs a ``stat`` per source and no lock.

State file ``RUN_DIR/monitor/megatron-log.json`` (version 1; written with :func:`clustertrain.core.run_paths.write_atomic`
after the rows)::

    {"version": 1, "clustertrain": "0.1.0",
     "sources": {"/fsx/p/logs/m/p-m-42.out": {"offset": 183264, "inode": 1311, "device": 66306}}}

``offset``: the bytes of that file already read (up to the end of its last whole line). A file now shorter than
``offset``, or another file under the same name (``inode``/``device`` differ), is read again from its start (its
rows then replace those from its first step on, by the resume rule). A damaged state file counts as none: every
source is read again from the start, and the resume rule rebuilds the same rows.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clustertrain.core.errors import ClusterTrainError, RunDirError
from clustertrain.core.run_paths import RunPaths, write_atomic

if TYPE_CHECKING:
    from clustertrain.project import ModelEntry, Project

STATE_VERSION = 1
FRAMEWORK = "megatron"
#: the head of an iteration line: ``[srun label: ][[timestamp]] iteration N/ M |``, then the ``key: value`` pairs
HEAD_RE = re.compile(
    r"^\s*(?:\d+:\s*)?(?:\[(?P<stamp>[^\]]*)\]\s*)?iteration\s+(?P<step>\d+)\s*/\s*(?P<total>\d+)\s*\|(?P<rest>.*)$")
#: Megatron's key -> the row's key (those with a rule of their own are converted in :func:`megatron_row`)
KEYS = {
    "consumed samples": "consumed_samples",
    "skipped samples": "skipped_samples",
    "elapsed time per iteration (ms)": "step_time_s",
    "throughput per GPU (TFLOP/s/GPU)": "tflops_per_gpu",
    "energy per GPU (J/iter/GPU)": "energy_per_gpu_j",
    "power per GPU (W/GPU)": "power_per_gpu_w",
    "learning rate": "lr",
    "global batch size": "global_batch",
    "lm loss": "loss",
    "loss scale": "loss_scale",
    "grad norm": "grad_norm",
    "num zeros": "num_zeros",
    "params norm": "params_norm",
    "number of skipped iterations": "skipped_iters",
    "number of nan iterations": "nan_iters",
}
#: bytes read at a time from a source
CHUNK = 1 << 20


@dataclass(frozen=True)
class IterationLine:
    """One iteration line: its step, Megatron's ``--train-iters``, its timestamp (Unix seconds, None: the line has
    none) and every ``key: value`` pair in Megatron's words (numbers as int or float, non-finite ones None)."""

    step: int
    train_iters: int
    time: float | None
    values: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RowContext:
    """What a row needs besides its line: the model's sequence length, its training FLOPs per token and the peak
    FLOP/s of all its GPUs (None: unknown, mfu is null)."""

    seq_len: int
    flops_per_token: float
    peak_total: float | None


def parse_line(line: str) -> IterationLine | None:
    """The iteration line ``line`` is (module docstring), or None for any other line."""
    m = HEAD_RE.match(line.rstrip("\r\n"))
    if m is None:
        return None
    values: dict[str, Any] = {}
    for part in m["rest"].split("|"):
        key, sep, value = part.rpartition(":")
        if sep and key.strip():
            values[key.strip()] = _value(value.strip())
    return IterationLine(int(m["step"]), int(m["total"]), _stamp(m["stamp"]), values)


def _value(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        return text
    return number if math.isfinite(number) else None


def _stamp(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.strip()).timestamp()  # with or without microseconds
    except ValueError:
        return None


def _snake(key: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", key.lower()).strip("_")


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def megatron_row(line: IterationLine, ctx: RowContext, now: float | None = None) -> dict[str, Any]:
    """The ``metrics.jsonl`` row of one iteration line (keys in the module docstring)."""
    v = line.values
    ms = _num(v.get("elapsed time per iteration (ms)"))
    step_time = ms / 1000.0 if ms is not None and ms > 0 else None
    batch = v.get("global batch size")
    samples = v.get("consumed samples")
    tps = ctx.seq_len * batch / step_time if step_time and isinstance(batch, int) else None
    row: dict[str, Any] = {
        "step": line.step, "loss": _num(v.get("lm loss")), "lr": _num(v.get("learning rate")),
        "grad_norm": _num(v.get("grad norm")),
        "tokens_per_s": round(tps, 1) if tps is not None else None,
        "step_time_s": round(step_time, 5) if step_time is not None else None,
        "mfu": round(ctx.flops_per_token * tps / ctx.peak_total, 4) if tps is not None and ctx.peak_total else None,
        "tokens": samples * ctx.seq_len if isinstance(samples, int) else None,
        "time": line.time if line.time is not None else (time.time() if now is None else now),
        "framework": FRAMEWORK,
    }
    for key, value in v.items():
        name = KEYS.get(key)
        if name in row:  # converted above
            continue
        if name is None:
            name = _snake(key)
            if not name:
                continue
            if name in row:
                name = f"megatron_{name}"
        row[name] = value
    for name in ("consumed_samples", "global_batch", "tflops_per_gpu", "loss_scale", "skipped_iters", "nan_iters"):
        row.setdefault(name, None)
    return row


def row_context(project: "Project", entry: "ModelEntry") -> RowContext:
    """The model's sequence length, FLOPs per token and the peak FLOP/s of its job's GPUs (module docstring)."""
    from clustertrain.plan.catalog import read_catalog
    from clustertrain.plan.node_counts import nodes_for
    from clustertrain.core.model_shape import ModelShape

    arch = entry.model
    flops = ModelShape.from_arch(arch, arch.vocab or 0).flops_per_token()  # the vocabulary does not enter it
    peak_total = None
    cluster = project.cluster
    gpu = read_catalog().gpu_of(cluster.instance_type) if cluster.instance_type and cluster.gpus_per_node else None
    if gpu is not None and gpu.peak_bf16_tflops:
        try:
            nodes = nodes_for(project).get(entry.name) or entry.plan.nodes or cluster.nodes
        except ClusterTrainError:
            nodes = entry.plan.nodes or cluster.nodes
        peak_total = gpu.peak_bf16_tflops * 1e12 * nodes * cluster.ranks_per_node
    return RowContext(arch.seq_len, flops, peak_total)


# -- the sources and the ingest ----------------------------------------------------------------------------------------


def state_path(paths: RunPaths) -> Path:
    return paths.monitor / "megatron-log.json"


def lock_path(paths: RunPaths) -> Path:
    return paths.monitor / "megatron-log.lock"


def log_sources(paths: RunPaths) -> list[Path]:
    """Where a run's Megatron output lies, in the order it was written: each Slurm job's output file
    (:func:`clustertrain.core.job_records.read_records`, oldest first; a requeued job appends to its file), then the
    local ranks' ``RUN_DIR/logs/rank<R>.log`` by rank."""
    from clustertrain.core.job_records import read_records

    out: list[Path] = []
    for record in read_records(paths):
        path = Path(record.output)
        if path not in out:
            out.append(path)
    ranks = []
    if paths.logs.is_dir():
        for p in paths.logs.glob("rank*.log"):
            m = re.fullmatch(r"rank(\d+)\.log", p.name)
            if m:
                ranks.append((int(m[1]), p))
    return out + [p for _, p in sorted(ranks)]


def ingest_megatron_log(paths: RunPaths, entry: "ModelEntry", project: "Project", sources: list[Path]) -> int:
    """Turn the iteration lines of ``sources`` written since the last call into rows of ``paths.metrics``; return
    how many rows were added (rules and the state file: module docstring). A source that does not exist yet is
    skipped; one that cannot be read is a :class:`~clustertrain.core.errors.RunDirError` naming it (nothing is written)."""
    if not _news(paths, sources, _read_state(paths)):
        return 0
    with _locked(paths):
        state = _read_state(paths)  # again: another ingest may have read the same bytes meanwhile
        lines: list[IterationLine] = []
        offsets: dict[str, dict[str, int]] = {}
        for source in sources:
            found = _read_source(source, state.get(str(source)))
            if found is None:
                continue
            new_lines, offsets[str(source)] = found
            lines += new_lines
        if lines:
            ctx = row_context(project, entry)
            now = time.time()
            _write_rows(paths, [megatron_row(line, ctx, now) for line in lines])
        if any(state.get(k) != v for k, v in offsets.items()):
            _write_state(paths, {**state, **offsets})
        return len(lines)


def _read_state(paths: RunPaths) -> dict[str, dict[str, int]]:
    try:
        raw = json.loads(state_path(paths).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    sources = raw.get("sources") if isinstance(raw, dict) and raw.get("version") == STATE_VERSION else None
    if not isinstance(sources, dict):
        return {}
    return {k: v for k, v in sources.items() if isinstance(v, dict) and isinstance(v.get("offset"), int)}


def _write_state(paths: RunPaths, sources: dict[str, dict[str, int]]) -> None:
    from clustertrain import __version__

    write_atomic(state_path(paths), json.dumps({"version": STATE_VERSION, "clustertrain": __version__,
                                                "sources": sources}, indent=1) + "\n")


def _start(st: os.stat_result, seen: dict[str, int] | None) -> int:
    """Where to read a file from: the recorded offset, or 0 for a new, shorter or replaced file."""
    if seen is None or st.st_size < seen["offset"]:
        return 0
    if seen.get("inode") not in (None, st.st_ino) or seen.get("device") not in (None, st.st_dev):
        return 0
    return seen["offset"]


def _news(paths: RunPaths, sources: list[Path], state: dict[str, dict[str, int]]) -> bool:
    """Whether some source has bytes past where the last ingest stopped (or is new, shorter, replaced)."""
    for source in sources:
        try:
            st = source.stat()
        except FileNotFoundError:
            continue
        except OSError:
            return True  # let the read say what is wrong
        seen = state.get(str(source))
        if st.st_size != (seen or {}).get("offset", 0) or _start(st, seen) == 0 and st.st_size:
            return True
    return False


def _read_source(source: Path, seen: dict[str, int] | None) -> tuple[list[IterationLine], dict[str, int]] | None:
    """The iteration lines of ``source``'s whole lines past its offset, and its new offset; None when it does not
    exist."""
    try:
        with open(source, "rb") as f:
            st = os.fstat(f.fileno())
            offset = _start(st, seen)
            f.seek(offset)
            lines: list[IterationLine] = []
            rest = b""
            while True:
                chunk = f.read(CHUNK)
                if not chunk:
                    break
                data = rest + chunk
                cut = data.rfind(b"\n") + 1
                rest = data[cut:]
                offset += cut
                for raw in data[:cut].split(b"\n"):
                    if b"iteration" in raw:
                        parsed = parse_line(raw.decode("utf-8", errors="replace"))
                        if parsed is not None:
                            lines.append(parsed)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise RunDirError(f"{source}: cannot read Megatron's output ({e.strerror or e}); "
                          "check the file's permissions") from e
    return lines, {"offset": offset, "inode": st.st_ino, "device": st.st_dev}


def _write_rows(paths: RunPaths, rows: list[dict[str, Any]]) -> None:
    """Append ``rows`` to ``metrics.jsonl``; a row at or below the last step first drops the rows from its step on
    (the file is then rewritten whole, atomically)."""
    from clustertrain.core.run_events import read_jsonl

    kept = read_jsonl(paths.metrics)
    last = _last_step(kept)
    rewrite = False
    for row in rows:
        if last is not None and row["step"] <= last:
            kept = [r for r in kept if not (isinstance(r.get("step"), int) and r["step"] >= row["step"])]
            rewrite = True
        kept.append(row)
        last = row["step"]
    if rewrite:
        write_atomic(paths.metrics, "".join(json.dumps(r) + "\n" for r in kept))
        return
    paths.metrics.parent.mkdir(parents=True, exist_ok=True)
    with open(paths.metrics, "a", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))


def _last_step(rows: list[dict[str, Any]]) -> int | None:
    steps = [r["step"] for r in rows if isinstance(r.get("step"), int)]
    return steps[-1] if steps else None


@contextmanager
def _locked(paths: RunPaths) -> Iterator[None]:
    lock = lock_path(paths)
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
