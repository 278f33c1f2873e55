"""Result structures shared by the validation stage, and the JSON/CSV forms they are written in.

Every benchmark we run and every tool output we parse ends up in one of two shapes:

* :class:`CollectiveRun` — one or more collectives (``all_reduce`` ... ``alltoall``), each a
  :class:`CollectiveReport` holding one :class:`CollectiveRow` per message size. Our own
  torch.distributed benchmark (``tool="clustertrain"``) and a parsed nccl-tests log
  (``tool="nccl-tests"``) produce the same structure.
* :class:`StorageRun` — one :class:`StorageResult` per mount/target, from our storage bench
  (fio or the Python fallback) or from parsed IOR / mdtest / fio JSON output.

Both carry ``failed`` (the verdict), ``problems`` (why it failed, one line each) and ``warnings``
(worth a look, not a failure). Units are in the field names: bytes, microseconds, GB/s (1e9 bytes
per second, as nccl-tests prints), MiB/s (as IOR and fio print), operations per second.

JSON written by ``model_dump_json`` carries ``format_version``; reading back ignores unknown
fields so that files written by a newer clustertrain still load.
"""

from __future__ import annotations

import csv
import io
import re
from typing import Literal

from pydantic import Field

from clustertrain.core.errors import ClusterTrainError
from clustertrain.core.schema import StoredModel

FORMAT_VERSION = 1

Op = Literal["all_reduce", "all_gather", "broadcast", "reduce", "reduce_scatter", "alltoall"]
ALL_OPS: tuple[str, ...] = ("all_reduce", "all_gather", "broadcast", "reduce", "reduce_scatter", "alltoall")


class ValidateError(ClusterTrainError):
    """A validation input (file, size argument, op name, requirements table) is wrong."""


def bus_factor(op: str, nranks: int) -> float:
    """nccl-tests' bus-bandwidth factor: busbw = algbw * factor (see nccl-tests doc/PERFORMANCE.md)."""
    n = max(int(nranks), 1)
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "alltoall"):
        return (n - 1) / n
    if op in ("broadcast", "reduce"):
        return 1.0
    raise ValidateError(f"unknown collective {op!r}; valid ops are: {', '.join(ALL_OPS)}")


class CollectiveRow(StoredModel):
    """One message size of one collective. ``wrong`` is None when the tool did not check (``N/A``)."""

    size_bytes: int = Field(description="Message size in bytes as nccl-tests counts it (the whole buffer).")
    count: int = Field(description="Element count as printed by nccl-tests (per rank for all_gather/reduce_scatter/alltoall).")
    dtype: str = Field(default="float", description="Element type.")
    redop: str = Field(default="", description="Reduction operation (sum, none, or empty).")
    root: int = Field(default=-1, description="Root rank for broadcast/reduce, -1 otherwise.")
    time_us: float | None = Field(description="Out-of-place time per operation in microseconds.")
    algbw_gbps: float | None = Field(description="Algorithm bandwidth: size / time, GB/s.")
    busbw_gbps: float | None = Field(description="Bus bandwidth: algbw * bus factor, GB/s.")
    wrong: int | None = Field(default=0, description="Wrong elements found by the correctness check; None = not checked.")
    inplace_time_us: float | None = Field(default=None, description="In-place time (nccl-tests only).")
    inplace_algbw_gbps: float | None = Field(default=None, description="In-place algorithm bandwidth (nccl-tests only).")
    inplace_busbw_gbps: float | None = Field(default=None, description="In-place bus bandwidth (nccl-tests only).")
    inplace_wrong: int | None = Field(default=None, description="In-place wrong elements; None = not checked or N/A.")
    error: str | None = Field(default=None, description="Why this size failed (timeout, wrong result...), if it did.")


class CollectiveReport(StoredModel):
    """One collective over a range of sizes."""

    op: str = Field(description="Collective name (all_reduce, ...) or 'unknown' when a log does not say.")
    nranks: int | None = Field(default=None, description="Number of ranks taking part, when known.")
    rows: list[CollectiveRow] = Field(default_factory=list, description="One row per message size.")
    avg_busbw_gbps: float | None = Field(default=None, description="Average bus bandwidth over the rows (nccl-tests trailer).")
    out_of_bounds: int | None = Field(default=None, description="nccl-tests 'Out of bounds values' count.")
    complete: bool = Field(default=False, description="True when the run reached its end (nccl-tests trailer seen).")
    failed: bool = Field(default=False, description="Verdict for this collective.")
    problems: list[str] = Field(default_factory=list, description="Why it failed, one line each.")
    notes: list[str] = Field(default_factory=list, description="Remarks (fallbacks used, skipped lines).")

    @property
    def peak_busbw_gbps(self) -> float | None:
        vals = [r.busbw_gbps for r in self.rows if r.busbw_gbps is not None]
        return max(vals) if vals else None


class CollectiveRun(StoredModel):
    """A whole collectives benchmark or nccl-tests log."""

    format_version: int = Field(default=FORMAT_VERSION, description="Version of this JSON layout.")
    kind: Literal["collectives"] = Field(default="collectives", description="Discriminator for parsed outputs.")
    tool: str = Field(description="Who produced the numbers: 'clustertrain' or 'nccl-tests'.")
    backend: str | None = Field(default=None, description="torch.distributed backend (gloo/nccl) for our own runs.")
    world_size: int | None = Field(default=None, description="Ranks in the job, when known.")
    hosts: list[str] = Field(default_factory=list, description="Hosts seen (nccl-tests Rank lines).")
    transport: str | None = Field(default=None, description="Network NCCL used: EFA, OFI, IB, Socket, or None if not logged.")
    nccl_version: str | None = Field(default=None, description="NCCL version from the log or torch.")
    ofi_nccl_version: str | None = Field(default=None, description="aws-ofi-nccl version from the NCCL INFO log.")
    reports: list[CollectiveReport] = Field(default_factory=list, description="One report per collective.")
    failed: bool = Field(default=False, description="Overall verdict: any collective failed, or nothing was measured.")
    problems: list[str] = Field(default_factory=list, description="Why the run failed, one line each.")
    warnings: list[str] = Field(default_factory=list, description="Not failures, but worth a look (socket fallback...).")

    def finish(self) -> CollectiveRun:
        """Derive the overall verdict from the reports (call after filling them)."""
        for rep in self.reports:
            if rep.failed:
                for p in rep.problems:
                    line = f"{rep.op}: {p}"
                    if line not in self.problems:
                        self.problems.append(line)
        if not any(r.rows for r in self.reports) and not self.problems:
            self.problems.append("no results table found")
        self.failed = bool(self.problems) or any(r.failed for r in self.reports)
        return self


class StorageResult(StoredModel):
    """Throughput and metadata rates for one target (mount point, test file or fio job)."""

    target: str = Field(description="Mount point, test path or job name this result is for.")
    tool: str = Field(description="fio, python, ior or mdtest.")
    fs_type: str | None = Field(default=None, description="File system type from /proc/mounts (our own runs).")
    free_bytes: int | None = Field(default=None, description="Free space on the file system (our own runs).")
    write_mib_s: float | None = Field(default=None, description="Sequential write throughput, MiB/s.")
    read_mib_s: float | None = Field(default=None, description="Sequential read throughput, MiB/s.")
    create_per_s: float | None = Field(default=None, description="File creations per second.")
    stat_per_s: float | None = Field(default=None, description="File stats per second.")
    unlink_per_s: float | None = Field(default=None, description="File removals per second.")
    ops: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="Every operation the tool reported: name -> {max, min, mean, stddev, ...}."
    )
    tasks: int | None = Field(default=None, description="Parallel tasks/jobs the tool ran.")
    cache_bypass: str | None = Field(
        default=None, description="How the page cache was kept out of the throughput (our own runs): direct "
                                  "(O_DIRECT), drop_caches, larger_than_ram, or none (reads may come from memory).")
    notes: list[str] = Field(default_factory=list, description="How the figures were obtained.")


class StorageRun(StoredModel):
    """A storage benchmark or a parsed IOR/mdtest/fio output."""

    format_version: int = Field(default=FORMAT_VERSION, description="Version of this JSON layout.")
    kind: Literal["storage"] = Field(default="storage", description="Discriminator for parsed outputs.")
    tool: str = Field(description="fio, python, ior, mdtest or 'clustertrain' for a mixed run.")
    results: list[StorageResult] = Field(default_factory=list, description="One result per target.")
    failed: bool = Field(default=False, description="Verdict.")
    problems: list[str] = Field(default_factory=list, description="Why it failed, one line each.")
    warnings: list[str] = Field(default_factory=list, description="Worth a look, not a failure.")


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_MULT = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def parse_size(text: str | int) -> int:
    """Parse a size like nccl-tests' ``-b/-e``: ``8``, ``1K``, ``4M``, ``4G`` (binary multiples)."""
    if isinstance(text, int):
        return text
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValidateError(f"size {text!r} is not a size; write a byte count or use K/M/G/T, e.g. 8, 1K, 4M, 4G")
    return int(float(m.group(1)) * _MULT[m.group(2).lower()])


def format_size(n: int) -> str:
    for unit, mult in (("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if n >= mult and n % mult == 0:
            return f"{n // mult}{unit}"
    return str(n)


_CSV_FIELDS = list(CollectiveRow.model_fields)


def collectives_csv(run: CollectiveRun) -> str:
    """One CSV line per (op, size), columns ``op`` then every :class:`CollectiveRow` field."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["op", "nranks", *_CSV_FIELDS])
    for rep in run.reports:
        for row in rep.rows:
            d = row.model_dump()
            w.writerow([rep.op, rep.nranks if rep.nranks is not None else "", *["" if d[f] is None else d[f] for f in _CSV_FIELDS]])
    return buf.getvalue()


def _fmt(v: float | None, width: int, prec: int = 2) -> str:
    return f"{'N/A' if v is None else f'{v:.{prec}f}':>{width}}"


def collectives_table(run: CollectiveRun) -> str:
    """An nccl-tests-like table, one block per collective, with the verdict at the end."""
    out: list[str] = []
    head = f"# tool {run.tool}  backend {run.backend or '-'}  ranks {run.world_size or '-'}"
    if run.transport:
        head += f"  transport {run.transport}"
    out.append(head)
    for rep in run.reports:
        out.append(f"#\n# {rep.op}  (ranks {rep.nranks or '-'})")
        out.append(f"#{'size':>12} {'count':>12} {'type':>6} {'redop':>6} {'root':>5} {'time':>10} {'algbw':>8} {'busbw':>8} {'#wrong':>7}")
        out.append(f"#{'(B)':>12} {'(elements)':>12} {'':>6} {'':>6} {'':>5} {'(us)':>10} {'(GB/s)':>8} {'(GB/s)':>8} {'':>7}")
        for r in rep.rows:
            wrong = "N/A" if r.wrong is None else str(r.wrong)
            line = (f" {r.size_bytes:>12} {r.count:>12} {r.dtype:>6} {r.redop or '-':>6} {r.root:>5} "
                    f"{_fmt(r.time_us, 10)} {_fmt(r.algbw_gbps, 8)} {_fmt(r.busbw_gbps, 8)} {wrong:>7}")
            if r.error:
                line += f"  ! {r.error}"
            out.append(line)
        for note in rep.notes:
            out.append(f"# note: {note}")
        if rep.avg_busbw_gbps is not None:
            out.append(f"# Avg bus bandwidth    : {rep.avg_busbw_gbps:g}")
        out.append(f"# {rep.op}: {'FAILED' if rep.failed else 'OK'}")
    for w in run.warnings:
        out.append(f"# warning: {w}")
    for p in run.problems:
        out.append(f"# problem: {p}")
    out.append(f"# verdict: {'FAILED' if run.failed else 'OK'}")
    return "\n".join(out)


def storage_table(run: StorageRun) -> str:
    out = [f"{'target':<30} {'tool':<7} {'write MiB/s':>12} {'read MiB/s':>12} {'create/s':>10} {'stat/s':>10} {'unlink/s':>10}"]
    for r in run.results:
        out.append(f"{r.target:<30} {r.tool:<7} {_fmt(r.write_mib_s, 12, 1)} {_fmt(r.read_mib_s, 12, 1)} "
                   f"{_fmt(r.create_per_s, 10, 0)} {_fmt(r.stat_per_s, 10, 0)} {_fmt(r.unlink_per_s, 10, 0)}")
        for n in r.notes:
            out.append(f"  note: {n}")
    for w in run.warnings:
        out.append(f"warning: {w}")
    for p in run.problems:
        out.append(f"problem: {p}")
    out.append(f"verdict: {'FAILED' if run.failed else 'OK'}")
    return "\n".join(out)
