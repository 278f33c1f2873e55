"""Parsers for storage benchmark output: IOR (text and ``-O summaryFormat=JSON``), mdtest, fio JSON.

Formats (learned from published runs; our samples are in ``tests/unit/validate/fixtures/``):

* IOR text: ``Max Write: 101.04 MiB/sec (105.95 MB/sec)`` / ``Max Read:`` lines (IOR 4.x prints
  them only with ``-v``), then ``Summary of all tests:`` with a header row
  ``Operation Max(MiB) Min(MiB) Mean(MiB) StdDev [Max(OPs) ...] Mean(s) ... #Tasks tPN reps ...``
  (IOR 3.x has fewer columns) and one row per operation (``write``, ``read``). Values are mapped by
  header name. Errors print ``ior ERROR: ...`` / ``ERROR: ...`` and usually no summary.
* IOR JSON: ``{"Version": ..., "tests": [{"Results": [...]}], "summary": [{"operation": "write",
  "bwMaxMIB": ..., "bwMeanMIB": ...}]}``.
* mdtest: ``SUMMARY rate (in ops/sec): (of N iterations)`` or ``SUMMARY rate: (of N iterations)``,
  then rows ``   File creation   [:]   max   min   mean   stddev`` (mdtest 3.4 puts a colon after
  the name). ``SUMMARY time`` tables (seconds) are ignored. Header ``N tasks, M files``.
* fio ``--output-format=json``: ``jobs[]`` with ``read``/``write`` sections (``bw`` in KiB/s,
  ``bw_bytes``, ``iops``) and ``error``; ``numjobs>1`` without ``group_reporting`` gives one entry
  per job (summed here). fio may print warnings before the JSON object.

Headline figures are means over iterations where the tool gives them (``ops`` keeps max/min/mean).
"""

from __future__ import annotations

import json
import re

from clustertrain.validate.results import StorageResult, StorageRun, ValidateError

_MIB = 1024 * 1024


def _json_start(text: str) -> int:
    m = re.search(r"^\s*\{", text, re.MULTILINE)
    return m.start() if m else -1


def load_json_output(text: str) -> dict | None:
    """The JSON object in a tool's output (fio may print notes before it), or None."""
    i = _json_start(text)
    if i < 0:
        return None
    try:
        obj, _ = json.JSONDecoder().raw_decode(text[i:].lstrip())
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def parse_fio_json(obj: dict | str, target: str | None = None) -> StorageRun:
    """fio JSON -> one result per job name (jobs with the same name are summed)."""
    if isinstance(obj, str):
        data = load_json_output(obj)
        if data is None:
            raise ValidateError("fio output holds no JSON object; run fio with --output-format=json")
        obj = data
    jobs = obj.get("jobs")
    if not isinstance(jobs, list):
        raise ValidateError("fio JSON has no 'jobs' list; is this fio --output-format=json output?")
    run = StorageRun(tool="fio")
    by_name: dict[str, StorageResult] = {}
    for job in jobs:
        name = target or job.get("jobname", "job")
        res = by_name.setdefault(name, StorageResult(target=name, tool="fio", tasks=0,
                                                    notes=[f"{obj.get('fio version', 'fio')} JSON"]))
        res.tasks = (res.tasks or 0) + 1
        if job.get("error"):
            run.problems.append(f"fio job {job.get('jobname')!r} reported error {job['error']}")
        for rw, field in (("write", "write_mib_s"), ("read", "read_mib_s")):
            sec = job.get(rw) or {}
            if sec.get("io_bytes", 0) > 0:
                bw = sec.get("bw_bytes", sec.get("bw", 0) * 1024) / _MIB
                setattr(res, field, (getattr(res, field) or 0.0) + bw)
                ops = res.ops.setdefault(rw, {"bw_mib_s": 0.0, "iops": 0.0, "io_bytes": 0.0})
                ops["bw_mib_s"] += bw
                ops["iops"] += float(sec.get("iops", 0.0))
                ops["io_bytes"] += float(sec.get("io_bytes", 0))
    run.results = list(by_name.values())
    if not run.results:
        run.problems.append("fio JSON holds no jobs")
    elif all(r.write_mib_s is None and r.read_mib_s is None for r in run.results) and not run.problems:
        run.problems.append("fio moved no data (io_bytes 0 in every job)")
    run.failed = bool(run.problems)
    return run


def _floats(toks: list[str]) -> list[float | None]:
    out: list[float | None] = []
    for t in toks:
        try:
            out.append(float(t))
        except ValueError:
            out.append(None)
    return out


def parse_ior(text: str) -> StorageRun:
    """IOR text or JSON summary -> a :class:`StorageRun` with one result (the test file)."""
    obj = load_json_output(text) if text.lstrip().startswith("{") else None
    if obj is not None and "tests" in obj:
        return _parse_ior_json(obj)
    run = StorageRun(tool="ior")
    path = re.search(r"^(?:Path|test filename)\s*:\s*(\S+)", text, re.MULTILINE)
    res = StorageResult(target=path.group(1) if path else "ior", tool="ior")
    if m := re.search(r"^Participating tasks\s*:\s*(\d+)", text, re.MULTILINE):
        res.tasks = int(m.group(1))
    for m in re.finditer(r"^Max (Write|Read):\s*([\d.]+) MiB/sec", text, re.MULTILINE):
        res.ops.setdefault(m.group(1).lower(), {})["max"] = float(m.group(2))
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("Operation") or "Max(MiB)" not in line:
            continue
        hdr = line.split()
        for row in lines[i + 1:]:
            toks = row.split()
            if not toks or toks[0] not in ("write", "read"):
                break
            vals = dict(zip(hdr[1:], toks[1:]))
            st = res.ops.setdefault(toks[0], {})
            for key, name in (("Max(MiB)", "max"), ("Min(MiB)", "min"), ("Mean(MiB)", "mean"), ("StdDev", "stddev"),
                              ("Mean(s)", "mean_s")):
                v = _floats([vals.get(key, "")])[0]
                if v is not None:
                    st[name] = v
            if "#Tasks" in vals and vals["#Tasks"].isdigit():
                res.tasks = int(vals["#Tasks"])
            if "reps" in vals and vals["reps"].isdigit():
                st["reps"] = float(vals["reps"])
    if not res.ops:  # IOR 4.x without -v and without summary: average the Results rows
        for m in re.finditer(r"^(write|read)\s+([\d.]+)\s+[\d.]+\s", text, re.MULTILINE):
            res.ops.setdefault(m.group(1), {"samples": 0.0, "sum": 0.0})
            res.ops[m.group(1)]["samples"] += 1
            res.ops[m.group(1)]["sum"] += float(m.group(2))
        for st in res.ops.values():
            st["mean"] = st.pop("sum") / st.pop("samples")
        if res.ops:
            res.notes.append("no summary in the output: averaged the Results rows")
    for op, field in (("write", "write_mib_s"), ("read", "read_mib_s")):
        st = res.ops.get(op)
        if st:
            setattr(res, field, st.get("mean", st.get("max")))
            if "mean" not in st:
                res.notes.append(f"{op}: only 'Max {op.title()}' printed; figure is the maximum")
    errors = [ln.strip() for ln in lines if re.match(r"^\s*(ior )?ERROR", ln)]
    run.problems.extend(errors[:5])
    if not res.ops:
        run.problems.append("no IOR results (no 'Max Write/Read' lines, Summary or Results rows): run did not finish")
    run.results = [res]
    run.failed = bool(run.problems)
    return run


def _parse_ior_json(obj: dict) -> StorageRun:
    run = StorageRun(tool="ior")
    tests = obj.get("tests") or [{}]
    res = StorageResult(target=str(tests[0].get("Path", "ior")), tool="ior", notes=[f"IOR {obj.get('Version', '')} JSON"])
    for s in obj.get("summary", []):
        op = s.get("operation")
        if op not in ("write", "read"):
            continue
        res.ops[op] = {k: float(s[v]) for k, v in (("max", "bwMaxMIB"), ("min", "bwMinMIB"), ("mean", "bwMeanMIB"),
                                                   ("stddev", "bwStdMIB")) if v in s}
        res.tasks = s.get("numTasks", res.tasks)
        setattr(res, f"{op}_mib_s", res.ops[op].get("mean"))
    if not res.ops:
        run.problems.append("IOR JSON has no summary: the run did not finish")
    run.results = [res]
    run.failed = bool(run.problems)
    return run


_MD_MAP = {"file creation": "create_per_s", "file stat": "stat_per_s", "file removal": "unlink_per_s"}


def parse_mdtest(text: str) -> StorageRun:
    """mdtest output -> one result with every operation's max/min/mean/stddev rate."""
    run = StorageRun(tool="mdtest")
    path = re.search(r"^Path\s*:\s*(\S+)", text, re.MULTILINE)
    res = StorageResult(target=path.group(1) if path else "mdtest", tool="mdtest")
    if m := re.search(r"^(\d+) tasks, (\d+) files", text, re.MULTILINE):
        res.tasks = int(m.group(1))
    in_rate = False
    for line in text.splitlines():
        if line.startswith("SUMMARY"):
            in_rate = line.startswith("SUMMARY rate")
            continue
        if not in_rate:
            continue
        m = re.match(r"^\s+([A-Za-z][A-Za-z ]*?)\s*:?\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$", line)
        if m:
            name = m.group(1).strip().lower()
            res.ops[name] = dict(zip(("max", "min", "mean", "stddev"), map(float, m.group(2, 3, 4, 5))))
        elif line.startswith("--") or (not line.strip() and res.ops):
            in_rate = False
    for name, field in _MD_MAP.items():
        if name in res.ops:
            setattr(res, field, res.ops[name]["mean"])
    zero = [n for n, st in res.ops.items() if st["max"] == 0.0]
    if zero:
        res.notes.append(f"not measured (rate 0, phase skipped by options): {', '.join(zero)}")
    run.problems.extend(ln.strip() for ln in text.splitlines() if re.match(r"^\s*(mdtest )?ERROR", ln))
    if not res.ops:
        run.problems.append("no 'SUMMARY rate' table: mdtest did not finish")
    run.results = [res]
    run.failed = bool(run.problems)
    return run
