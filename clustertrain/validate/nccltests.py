"""Parser for NVIDIA nccl-tests output (``all_reduce_perf`` ... ``alltoall_perf``) and NCCL debug logs.

What the text can look like (learned from published runs; our own samples are in
``tests/unit/validate/fixtures/``):

* Line prefixes added by launchers: ``0: `` (``srun -l``), ``[1,0]<stdout>:`` / ``[1,0]<stderr>:``
  (Open MPI ``--tag-output``), and indentation. They are stripped; stderr lines only count for
  failure messages, never for table rows.
* Header ``# nThread 1 nGpus 1 minBytes 8 ...``, ``#  Rank  0 Group  0 Pid ... on HOST device ...``
  (legacy: ``#   Rank  0 Pid ...``), since 2.17 ``# nccl-tests version ...`` and
  ``# Collective test starting: all_reduce_perf`` / ``... concluded: ...``.
* Column header ``#  size  count  type  redop  root  time algbw busbw #wrong  time algbw busbw #wrong``.
  Legacy (before ~2.10): no ``root``, ``error`` instead of ``#wrong`` (floats or ``N/A``);
  legacy all_gather has no ``redop``; legacy alltoall leaves ``redop`` empty (one token short).
  Columns can overflow their width, so rows are split on whitespace and mapped by header name.
* ``#wrong`` may be ``N/A`` (not checked, e.g. in-place alltoall).
* ``NCCL INFO`` / ``NCCL WARN`` / ``NCCL version`` lines anywhere, including between rows; the network
  NCCL used is read from them by :func:`clustertrain.validate.transport.detect_transport`.
* Trailer ``# Out of bounds values : N OK|FAILED`` and ``# Avg bus bandwidth : X [OK|FAILED]``.
  A run that dies (crash, kill, hang) never prints the trailer; failures print
  ``Test CUDA failure ...`` / ``Test NCCL failure ...`` / `` .. host pid N: Test failure ...``.
* Several tests in one log (a loop over the six binaries): each column header that follows rows,
  and each ``Collective test starting`` / ``nThread`` line, starts a new report.
"""

from __future__ import annotations

import re

from clustertrain.validate.results import ALL_OPS, CollectiveReport, CollectiveRow, CollectiveRun, bus_factor
from clustertrain.validate.transport import detect_transport  # noqa: F401  (the NCCL log formats live there)

_PREFIXES = (
    re.compile(r"^\s*\[\d+,\d+\]<(stdout|stderr)>:"),  # Open MPI --tag-output
    re.compile(r"^\s*\d+:\s?(?=\s|#|\S)"),  # srun -l  ("0: ")
)
_TYPE_BYTES = {"int8": 1, "uint8": 1, "char": 1, "half": 2, "float16": 2, "bfloat16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1,
               "int32": 4, "uint32": 4, "int": 4, "float": 4, "float32": 4, "int64": 8, "uint64": 8, "double": 8, "float64": 8}
_FAIL_RE = re.compile(r"Test (CUDA |NCCL )?failure|NCCL error|Segmentation fault|core dumped|Aborted|"
                      r"DUE TO TIME LIMIT|CANCELLED AT|exited on signal|terminated with signal|Killed", re.IGNORECASE)
_RANK_RE = re.compile(r"^#\s+Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)")
_START_RE = re.compile(r"^#\s*Collective test starting:\s*(\S+)|^=+\s*Starting\s+(\S+)")
_AVG_RE = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)\s*(OK|FAILED)?")
_OOB_RE = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)\s*(OK|FAILED)?")


def strip_prefix(line: str) -> tuple[str, bool]:
    """Remove launcher prefixes. Returns (text, is_stderr)."""
    is_err = False
    for _ in range(3):  # prefixes can stack (mpirun inside srun -l)
        m = _PREFIXES[0].match(line)
        if m:
            is_err = is_err or m.group(1) == "stderr"
            line = line[m.end():]
            continue
        m = _PREFIXES[1].match(line)
        if m and not re.match(r"^\s*\d+\s+\d+", line):
            line = line[m.end():]
            continue
        break
    return line.strip(), is_err


def _num(tok: str) -> float | None:
    try:
        return float(tok)
    except ValueError:
        return None


def _wrong(tok: str) -> int | None:
    if tok.upper() == "N/A":
        return None
    v = float(tok)  # legacy 'error' column holds max error floats (e.g. 5e-07) — small is fine
    return int(v) if v == int(v) and v >= 1 else (0 if v < 1e-3 else 1)


def _op_from_binary(name: str) -> str:
    base = name.rsplit("/", 1)[-1]
    base = re.sub(r"(_perf)?(_mpi)?$", "", base)
    return base if base in ALL_OPS else base or "unknown"


class _Test:
    def __init__(self) -> None:
        self.op: str | None = None
        self.header: list[str] | None = None
        self.rows: list[CollectiveRow] = []
        self.ranks: dict[int, str] = {}
        self.avg: float | None = None
        self.avg_failed = False
        self.oob: int | None = None
        self.oob_failed = False
        self.trailer = False
        self.failures: list[str] = []
        self.notes: list[str] = []
        self.inplace_na = False
        self.redop_blank = False

    def started(self) -> bool:
        return bool(self.rows or self.header or self.trailer or self.failures)


def _parse_row(test: _Test, text: str) -> CollectiveRow | None:
    toks = text.split()
    hdr = test.header
    if not hdr or not toks or not re.fullmatch(r"\d+", toks[0]):
        return None
    if len(toks) == len(hdr) - 1 and "redop" in hdr:  # legacy alltoall: empty redop column
        toks.insert(hdr.index("redop"), "")
        test.redop_blank = True
    if len(toks) != len(hdr):
        return None
    idx = {"time": [], "algbw": [], "busbw": [], "wrong": []}
    for i, h in enumerate(hdr):
        key = "wrong" if h in ("#wrong", "error") else h
        if key in idx:
            idx[key].append(i)
    try:
        vals = {k: [toks[i] for i in v] for k, v in idx.items()}
        nums = [_num(t) for k in ("time", "algbw", "busbw") for t in vals[k]]
        if any(n is None for n in nums) or len(vals["time"]) < 1:
            return None
        wrongs = [_wrong(t) for t in vals["wrong"]]
    except (ValueError, IndexError):
        return None
    get = lambda name, default: toks[hdr.index(name)] if name in hdr else default  # noqa: E731
    two = len(vals["time"]) > 1
    if two and vals["wrong"][1:2] == ["N/A"]:
        test.inplace_na = True
    return CollectiveRow(
        size_bytes=int(toks[0]), count=int(get("count", "0")), dtype=get("type", "float"), redop=get("redop", ""),
        root=int(get("root", "-1")),
        time_us=float(vals["time"][0]), algbw_gbps=float(vals["algbw"][0]), busbw_gbps=float(vals["busbw"][0]),
        wrong=wrongs[0] if wrongs else None,
        inplace_time_us=float(vals["time"][1]) if two else None,
        inplace_algbw_gbps=float(vals["algbw"][1]) if two else None,
        inplace_busbw_gbps=float(vals["busbw"][1]) if two else None,
        inplace_wrong=wrongs[1] if len(wrongs) > 1 else None,
    )


def _infer_op(test: _Test, nranks: int | None) -> str:
    """Guess the collective when the log does not name it (from size/count ratio, redop and root)."""
    rows = [r for r in test.rows if r.count > 0]
    if not rows:
        return "unknown"
    r = rows[-1]
    ratio = r.size_bytes / (r.count * _TYPE_BYTES.get(r.dtype, 4))
    has_redop = "redop" in (test.header or [])
    if ratio > 1.5:  # per-rank count printed: all_gather / reduce_scatter / alltoall
        if r.root >= 0:
            return "unknown"  # scatter/gather: not one of the six we check
        if r.redop not in ("", "none"):
            return "reduce_scatter"
        if test.inplace_na or test.redop_blank:
            return "alltoall"
        if not has_redop or r.redop == "none":
            return "all_gather"
        return "unknown"
    if r.root >= 0:
        return "broadcast" if r.redop == "none" else "reduce"
    if r.redop not in ("", "none"):
        # legacy logs have no root column: tell all_reduce from reduce by the bus factor
        if "root" not in (test.header or []) and r.algbw_gbps and r.busbw_gbps and nranks and nranks > 2 and abs(r.busbw_gbps / r.algbw_gbps - 1) < 0.05:
            return "reduce"
        return "all_reduce"
    return "unknown"


def _finish(test: _Test, run_ranks: dict[int, str]) -> CollectiveReport:
    ranks = test.ranks or run_ranks
    nranks = len(ranks) if ranks else None
    if nranks is None and test.rows:  # infer from the size/count ratio of gather-type ops
        r = next((r for r in reversed(test.rows) if r.count > 0), None)
        if r:
            ratio = round(r.size_bytes / (r.count * _TYPE_BYTES.get(r.dtype, 4)))
            nranks = ratio if ratio > 1 else None
    op = test.op or _infer_op(test, nranks)
    rep = CollectiveReport(op=op, nranks=nranks, rows=test.rows, avg_busbw_gbps=test.avg, out_of_bounds=test.oob,
                           complete=test.trailer, notes=test.notes)
    if test.op is None and op != "unknown":
        rep.notes.append(f"collective inferred as {op} from the columns (the log does not name the binary)")
    bad = [r for r in test.rows if (r.wrong or 0) > 0 or (r.inplace_wrong or 0) > 0]
    for r in bad:
        rep.problems.append(f"size {r.size_bytes}: #wrong {r.wrong if r.wrong is not None else 'N/A'} out-of-place, "
                            f"{r.inplace_wrong if r.inplace_wrong is not None else 'N/A'} in-place")
    if test.oob_failed or (test.oob or 0) > 0:
        rep.problems.append(f"Out of bounds values : {test.oob} FAILED")
    if test.avg_failed:
        rep.problems.append("Avg bus bandwidth below the check bound (FAILED)")
    rep.problems.extend(test.failures)
    if not test.rows and not test.failures:
        rep.problems.append("no result rows (the test did not start)")
    elif not test.trailer:
        rep.problems.append("incomplete: no '# Avg bus bandwidth' trailer (crashed, killed or truncated)")
    if test.avg is not None and test.avg > 5000:
        rep.notes.append(f"avg busbw {test.avg:g} GB/s is implausible (in-place timing of a 1-rank run?)")
    rep.failed = bool(rep.problems)
    return rep


def parse_nccl_tests(text: str) -> CollectiveRun:
    """Parse nccl-tests output (any of the six binaries, old or new layout) into a :class:`CollectiveRun`."""
    tests: list[_Test] = []
    cur = _Test()
    all_ranks: dict[int, str] = {}
    clean_lines: list[str] = []

    def new_test() -> _Test:
        nonlocal cur
        if cur.started():
            tests.append(cur)
        cur = _Test()
        return cur

    for raw in text.splitlines():
        line, is_err = strip_prefix(raw)
        clean_lines.append(line)
        if not line:
            continue
        if not line.startswith("#") and _FAIL_RE.search(line) and "NCCL INFO" not in line:
            if line[:200] not in cur.failures:
                cur.failures.append(line[:200])
            # a failure can cut a row short: never read the rest of this line as data
            continue
        if is_err or "NCCL INFO" in line or "NCCL WARN" in line or line.startswith("NCCL version"):
            continue
        if m := _START_RE.match(line):
            if cur.started():
                new_test()
            cur.op = _op_from_binary(m.group(1) or m.group(2))
            continue
        if line.startswith("# nThread"):
            if cur.rows or cur.trailer:
                new_test()
            continue
        if m := _RANK_RE.match(line):
            if cur.rows or cur.trailer:
                new_test()
            cur.ranks[int(m.group(1))] = m.group(2)
            all_ranks[int(m.group(1))] = m.group(2)
            continue
        if line.startswith("#") and re.search(r"\bsize\b", line) and re.search(r"\bcount\b", line):
            if cur.rows or cur.trailer:
                new_test()
            cur.header = line.lstrip("#").split()
            continue
        if m := _OOB_RE.match(line):
            cur.oob, cur.oob_failed = int(m.group(1)), m.group(2) == "FAILED"
            continue
        if m := _AVG_RE.match(line):
            cur.avg, cur.avg_failed, cur.trailer = _num(m.group(1)), m.group(2) == "FAILED", True
            continue
        if m := re.match(r"^#\s*Collective test concluded", line):
            continue
        if line.startswith("#") or line == "...":
            continue
        row = _parse_row(cur, line)
        if row is not None:
            cur.rows.append(row)
        elif cur.header and re.match(r"^\d+\s+\d+", line):
            cur.notes.append(f"skipped a cut-off row: {line[:80]!r}")
    if cur.started() or not tests:
        tests.append(cur)

    info = detect_transport("\n".join(clean_lines))
    run = CollectiveRun(tool="nccl-tests", transport=info["transport"], nccl_version=info["nccl_version"],
                        ofi_nccl_version=info["ofi_nccl_version"], hosts=sorted(set(all_ranks.values())),
                        world_size=len(all_ranks) or None)
    run.reports = [_finish(t, all_ranks) for t in tests]
    if run.world_size is None:
        run.world_size = next((r.nranks for r in run.reports if r.nranks), None)
    for rep in run.reports:  # check that busbw matches the op's bus factor (catches a misread op)
        if rep.op in ALL_OPS and rep.nranks and rep.nranks > 1:
            f = bus_factor(rep.op, rep.nranks)
            big = [r for r in rep.rows if r.algbw_gbps and r.algbw_gbps >= 1.0]
            if big and all(abs(r.busbw_gbps / r.algbw_gbps - f) > 0.05 * f for r in big):
                rep.notes.append(f"busbw/algbw does not match {rep.op}'s factor {f:.3f} for {rep.nranks} ranks")
    if info["socket_fallback"]:
        run.warnings.append("NCCL used TCP sockets ('Using network Socket'): EFA/aws-ofi-nccl was not used")
    return run.finish()
