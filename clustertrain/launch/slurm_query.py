"""Read Slurm job and node state: pure parsers plus thin runners around the Slurm client commands.

Formats parsed here (Slurm 22.05; tests feed output captured from a real local cluster):

* ``squeue --json``: ``{"jobs": [{"job_id", "name", "job_state", "exit_code", "state_reason",
  "nodes", "restart_cnt", "start_time", "end_time", ...}]}``. ``exit_code`` is the raw wait status
  (``exit << 8 | signal``), times are epoch seconds (0 = not yet).
* ``scontrol show job -o ID``: one line of ``Key=Value`` pairs separated by spaces; values may hold
  spaces (``JobName=my job``, ``Reason=...``), so a pair ends where the next `` Key=`` starts.
  ``ExitCode=exit:signal``, times ISO-8601 local time or ``Unknown``/``None``.
* jobcomp/filetxt (``JobCompLoc``): one ``Key=Value`` line per job end, appended by slurmctld. A
  requeued job has one line per run; the last line is the final state.
* ``scontrol show node -o``: one ``Key=Value`` line per node (``NodeName``, ``NodeAddr``, ``State``).
* Slurm hostlists (``node[1-3,5]``, ``gpu-[01-02],cpu1``): :func:`expand_hostlist`.

A backend calls :func:`query_job` while it waits for a job: it asks the controller and, once the
job has left it (``MinJobAge`` after the end), falls back to the jobcomp file. Where there is none
(ParallelCluster runs ``JobCompType=jobcomp/none`` with ``MinJobAge=300``) it raises :class:`JobGone`,
and the caller reads the run directory's own records (:func:`clustertrain.launch.jobs.read_end_marker`).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from clustertrain.errors import LaunchError

#: States after which a job will not run again by itself.
FINISHED_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                             "PREEMPTED", "BOOT_FAIL", "DEADLINE", "REVOKED"})
_KEY = re.compile(r"(?:^|\s)([A-Z][A-Za-z0-9_/:.]*)=")  # Slurm keys start upper-case
_UNKNOWN_JOB = ("Invalid job id", "Invalid job ID")


class JobGone(LaunchError):
    """The controller has forgotten the job (MinJobAge after its end) and no jobcomp/filetxt log knows it."""


@dataclass(frozen=True)
class JobState:
    """One job as Slurm reports it. ``exit_code`` is the exit status of the batch script, ``signal``
    the signal that killed it (0 for none); both ``None`` while the job has not ended."""

    job_id: str
    name: str
    state: str
    exit_code: int | None = None
    signal: int | None = None
    reason: str | None = None
    nodes: tuple[str, ...] = ()
    restarts: int = 0
    start_time: datetime | None = None
    end_time: datetime | None = None
    source: str = ""

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_STATES


@dataclass(frozen=True)
class NodeInfo:
    """One node of ``scontrol show node -o``. ``state`` is the base state (``IDLE``, ``ALLOCATED``...),
    ``flags`` the rest (``DRAIN``, ``NOT_RESPONDING``...)."""

    name: str
    addr: str
    hostname: str
    state: str
    flags: tuple[str, ...] = ()
    cpus: int = 0
    gres: str = ""
    reason: str = ""


# -- pure parsers ----------------------------------------------------------------------------------

def parse_kv_line(line: str) -> dict[str, str]:
    """Split one ``Key=Value Key2=Value with spaces`` line (scontrol -o, jobcomp/filetxt)."""
    line = line.strip()
    matches = list(_KEY.finditer(line))
    out: dict[str, str] = {}
    for m, nxt in zip(matches, [*matches[1:], None]):
        out[m.group(1)] = line[m.end():nxt.start() if nxt else len(line)].strip()
    return out


def decode_wait_status(raw: int) -> tuple[int, int]:
    """Raw wait status (squeue/scontrol ``--json`` ``exit_code``) -> (exit status, signal)."""
    return (raw >> 8) & 0xFF, raw & 0x7F


def parse_exit_code(text: str) -> tuple[int | None, int | None]:
    """``ExitCode=2:0`` -> (2, 0); empty -> (None, None)."""
    exit_s, _, sig_s = text.partition(":")
    try:
        return int(exit_s), int(sig_s or 0)
    except ValueError:
        return None, None


def parse_time(text: str | int | None) -> datetime | None:
    """Slurm time: epoch seconds (JSON, 0 = unset) or ISO-8601 local time (``Unknown``/``None`` = unset)."""
    if text is None or text in ("", "Unknown", "None", "N/A", 0):
        return None
    if isinstance(text, int):
        return datetime.fromtimestamp(text)
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def expand_hostlist(expr: str) -> list[str]:
    """Expand a Slurm hostlist: ``node[1-3,5]`` -> node1 node2 node3 node5; keeps zero padding
    (``gpu-[01-02]``); commas outside brackets separate hosts; several bracket groups multiply."""
    hosts: list[str] = []
    for item in _split_top(expr.strip()):
        parts = re.split(r"(\[[^\]]*\])", item)
        choices: list[list[str]] = []
        for part in parts:
            if part.startswith("["):
                choices.append(_expand_range(part[1:-1], expr))
            elif part:
                choices.append([part])
        hosts.extend("".join(combo) for combo in itertools.product(*choices))
    return hosts


def parse_squeue_json(text: str) -> list[JobState]:
    """``squeue --json`` (or ``scontrol show job --json``) -> one JobState per job."""
    try:
        jobs = json.loads(text)["jobs"]
    except (ValueError, KeyError, TypeError) as exc:
        raise LaunchError(f"squeue --json output is not the expected JSON ({exc}); is this Slurm >= 21.08?") from None
    out = []
    for job in jobs:
        state = job.get("job_state", "")
        state = state[0] if isinstance(state, list) else state  # 23.02+ gives a list of flags
        exit_code = signal = None
        if state in FINISHED_STATES and isinstance(job.get("exit_code"), int):
            exit_code, signal = decode_wait_status(job["exit_code"])
        out.append(JobState(
            job_id=str(job["job_id"]), name=job.get("name", ""), state=state, exit_code=exit_code, signal=signal,
            reason=_none_if_none(job.get("state_reason")), nodes=tuple(expand_hostlist(job.get("nodes") or "")),
            restarts=int(job.get("restart_cnt") or 0), start_time=parse_time(job.get("start_time") or 0),
            end_time=parse_time(job.get("end_time") or 0) if state in FINISHED_STATES else None,
            source="squeue"))
    return out


def parse_scontrol_job(text: str) -> JobState:
    """``scontrol show job -o ID`` (one line) -> JobState."""
    kv = parse_kv_line(text.strip().splitlines()[0] if text.strip() else "")
    if "JobId" not in kv:
        raise LaunchError(f"scontrol show job output has no JobId: {text.strip()[:120]!r}")
    state = kv.get("JobState", "")
    exit_code, signal = parse_exit_code(kv.get("ExitCode", "")) if state in FINISHED_STATES else (None, None)
    return JobState(
        job_id=kv["JobId"], name=kv.get("JobName", ""), state=state, exit_code=exit_code, signal=signal,
        reason=_none_if_none(kv.get("Reason")), nodes=tuple(expand_hostlist(_none_if_none(kv.get("NodeList")) or "")),
        restarts=int(kv.get("Restarts") or 0), start_time=parse_time(kv.get("StartTime")),
        end_time=parse_time(kv.get("EndTime")) if state in FINISHED_STATES else None, source="scontrol")


def parse_jobcomp(text: str) -> dict[str, JobState]:
    """jobcomp/filetxt lines -> the last record of each job id, ``restarts`` = earlier records of it."""
    seen: dict[str, int] = {}
    out: dict[str, JobState] = {}
    for line in text.splitlines():
        kv = parse_kv_line(line)
        if "JobId" not in kv:
            continue
        job_id = kv["JobId"]
        exit_code, signal = parse_exit_code(kv.get("ExitCode", ""))
        out[job_id] = JobState(
            job_id=job_id, name=kv.get("Name", ""), state=kv.get("JobState", ""), exit_code=exit_code,
            signal=signal, nodes=tuple(expand_hostlist(_none_if_none(kv.get("NodeList")) or "")),
            restarts=seen.get(job_id, 0), start_time=parse_time(kv.get("StartTime")),
            end_time=parse_time(kv.get("EndTime")), source="jobcomp")
        seen[job_id] = seen.get(job_id, 0) + 1
    return out


def parse_nodes(text: str) -> list[NodeInfo]:
    """``scontrol show node -o`` -> one NodeInfo per line."""
    nodes = []
    for line in text.splitlines():
        kv = parse_kv_line(line)
        if "NodeName" not in kv:
            continue
        base, *flags = kv.get("State", "").split("+")
        nodes.append(NodeInfo(name=kv["NodeName"], addr=kv.get("NodeAddr", ""), hostname=kv.get("NodeHostName", ""),
                              state=base.rstrip("*~#%$@!^-"), flags=tuple(flags), cpus=int(kv.get("CPUTot") or 0),
                              gres=_none_if_none(kv.get("Gres")) or "", reason=_none_if_none(kv.get("Reason")) or ""))
    return nodes


# -- thin runners ----------------------------------------------------------------------------------

def query_job(job_id: str | int, env: Mapping[str, str] | None = None, *,
              jobcomp_path: str | Path | None = None) -> JobState:
    """The job as the controller knows it; after it left the controller, its jobcomp/filetxt record.
    ``env`` holds the client variables (``SLURM_CONF``...), merged over ``os.environ``."""
    proc = _run(["scontrol", "show", "job", "-o", str(job_id)], env, check=False)
    if proc.returncode == 0 and proc.stdout.strip():
        return parse_scontrol_job(proc.stdout)
    if not any(s in proc.stderr for s in _UNKNOWN_JOB):
        raise LaunchError(f"`scontrol show job {job_id}` failed: {_last_line(proc.stderr)}")
    path = Path(jobcomp_path) if jobcomp_path else find_jobcomp(env)
    if path is None:
        raise JobGone(f"Slurm job {job_id} is unknown to the controller, which forgets a job MinJobAge after its end, and "
                      "this cluster keeps no completion log (JobCompType is not jobcomp/filetxt)")
    record = parse_jobcomp(path.read_text(errors="replace") if path.exists() else "").get(str(job_id))
    if record is None:
        raise JobGone(f"Slurm job {job_id} is unknown to the controller and not in {path}; check the job id")
    return record


def list_jobs(env: Mapping[str, str] | None = None) -> list[JobState]:
    """Every job the controller knows (``squeue --json``)."""
    return parse_squeue_json(_run(["squeue", "--json"], env).stdout)


def query_nodes(env: Mapping[str, str] | None = None) -> list[NodeInfo]:
    return parse_nodes(_run(["scontrol", "show", "node", "-o"], env).stdout)


def find_jobcomp(env: Mapping[str, str] | None = None) -> Path | None:
    """JobCompLoc of the cluster when it runs jobcomp/filetxt (the only completion log we can read); else None."""
    kv: dict[str, str] = {}
    for line in _run(["scontrol", "show", "config"], env).stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            kv[key.strip()] = value.strip()
    if kv.get("JobCompType") != "jobcomp/filetxt" or not kv.get("JobCompLoc"):
        return None
    return Path(kv["JobCompLoc"])


# -- helpers ---------------------------------------------------------------------------------------

def _run(argv: list[str], env: Mapping[str, str] | None, check: bool = True) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=60)
    except FileNotFoundError:
        raise LaunchError(f"`{argv[0]}` not found: install the Slurm client (slurm-client) or fix PATH") from None
    if check and proc.returncode != 0:
        raise LaunchError(f"`{' '.join(argv)}` failed: {_last_line(proc.stderr)}")
    return proc


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no error output"


def _none_if_none(value: str | None) -> str | None:
    return None if value in (None, "", "(null)", "None") else value


def _split_top(expr: str) -> list[str]:
    items, depth, cur = [], 0, ""
    for ch in expr:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    if depth:
        raise LaunchError(f"hostlist {expr!r} has an unclosed '['")
    return [i for i in [*items, cur] if i]


def _expand_range(body: str, expr: str) -> list[str]:
    out = []
    for piece in body.split(","):
        lo, _, hi = piece.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise LaunchError(f"hostlist {expr!r}: bad range {piece!r}; expected forms like node[1-3,5]")
        width = len(lo)
        out.extend(str(i).zfill(width) for i in range(int(lo), int(hi or lo) + 1))
    return out
