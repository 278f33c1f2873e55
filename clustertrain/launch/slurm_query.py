"""Read Slurm job and node state: pure parsers plus thin runners around the Slurm client commands.

Formats parsed here (tests feed output captured from a real local Slurm 22.05 cluster, plus 23.02/23.11/24.05
JSON and sacct samples written by hand from SchedMD's sources, said so in each file):

* ``scontrol show job -o ID`` (what :func:`query_job` asks first): one line of ``Key=Value`` pairs separated by
  spaces; values may hold spaces (``JobName=my job``, ``Reason=...``), so a pair ends where the next `` Key=``
  starts. ``ExitCode=exit:signal``, times ISO-8601 local time or ``Unknown``/``None``. The same text from 22.05
  to 25.11 (``src/api/job_info.c``, ``src/scontrol/info_job.c`` since 25.11).
* ``squeue --json`` / ``scontrol show job --json``: ``{"jobs": [{"job_id", "name", "job_state", "exit_code",
  "state_reason", "nodes", "restart_cnt", "start_time", "end_time", ...}]}``, whose value shapes changed with the
  data_parser plugin of each release (``src/plugins/data_parser/v0.0.3x/parsers.c``):

  - 22.05 (openapi v0.0.38): ``job_state`` a string, ``exit_code`` the raw wait status (``exit << 8 | signal``),
    times epoch seconds (0 = not yet).
  - 23.02 (v0.0.39): ``exit_code`` ``{"set", "infinite", "number": raw wait status}``; the rest as 22.05.
  - 23.11, 24.05, 24.11, 25.05, 25.11 (v0.0.40 to v0.0.44): ``job_state`` a list (base state, then flags:
    ``["COMPLETED", "COMPLETING"]``), times ``{"set", "infinite", "number"}``, ``exit_code``
    ``{"status": ["SUCCESS"|"ERROR"|"SIGNALED"|"PENDING"...], "return_code": {...}, "signal": {"id": {...},
    "name": "KILL"}}``. With ``+complex`` numbers are plain again (``null`` unset, ``"Infinity"``).
* ``sacct -X -D -n -P -o JobID,State,ExitCode,Start,End,NodeList,Reason,JobName`` (where the cluster keeps
  accounting, ``AccountingStorageType=accounting_storage/slurmdbd``): one ``|``-separated line per run of the
  job, oldest first (``-D`` lists each run of a requeued job); ``CANCELLED by UID``; ``None assigned`` nodes.
* jobcomp/filetxt (``JobCompLoc``): one ``Key=Value`` line per job end, appended by slurmctld. A
  requeued job has one line per run; the last line is the final state.
* ``scontrol show node -o``: one ``Key=Value`` line per node (``NodeName``, ``NodeAddr``, ``State``).
* Slurm hostlists (``node[1-3,5]``, ``gpu-[01-02],cpu1``): :func:`clustertrain.core.ranks.expand_hostlist`.

A backend calls :func:`query_job` while it waits for a job: it asks the controller and, once the
job has left it (``MinJobAge`` after the end), the accounting database (sacct), else the jobcomp file.
Where there is neither (ParallelCluster without a ``Database`` runs ``JobCompType=jobcomp/none`` with
``MinJobAge=300``) it raises :class:`JobGone`, and the caller reads the run directory's own records
(:func:`clustertrain.core.job_records.read_end_marker`).
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from clustertrain.core.errors import LaunchError
from clustertrain.launch.slurmcli import last_line, run_slurm
from clustertrain.core.ranks import expand_hostlist

#: States after which a job will not run again by itself.
FINISHED_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                             "PREEMPTED", "BOOT_FAIL", "DEADLINE", "REVOKED"})
_KEY = re.compile(r"(?:^|\s)([A-Z][A-Za-z0-9_/:.]*)=")  # Slurm keys start upper-case
_UNKNOWN_JOB = ("Invalid job id", "Invalid job ID")
#: State flags in the order ``job_state_string()`` (src/common/slurm_protocol_defs.c, 22.05-25.11) lets one
#: win over the base state: what ``scontrol show job`` prints for a JSON ``job_state`` list.
_STATE_FLAGS = ("COMPLETING", "STAGE_OUT", "CONFIGURING", "RESIZING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD",
                "SPECIAL_EXIT", "STOPPED", "REVOKED", "RESV_DEL_HOLD", "SIGNALING")
#: sacct fields :func:`query_job` asks for; JobName last, as it may hold the ``|`` separator.
SACCT_FIELDS = ("JobID", "State", "ExitCode", "Start", "End", "NodeList", "Reason", "JobName")


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


def json_number(value: object) -> int | None:
    """A number of Slurm JSON in any release's shape -> int, or None when unset or infinite: plain ``5``
    (22.05, ``+complex``), ``null``/``"Infinity"`` (``+complex``), ``{"set": true, "infinite": false,
    "number": 5}`` (23.02+; ``set`` false = unset)."""
    if isinstance(value, dict):
        return int(value.get("number") or 0) if value.get("set") and not value.get("infinite") else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value)


def json_exit_code(value: object) -> tuple[int | None, int | None]:
    """JSON ``exit_code`` -> (exit status, signal): a raw wait status (22.05 plain, 23.02 ``{"set", "number"}``) or
    23.11+'s ``{"status": [...], "return_code": {...}, "signal": {"id": {...}, "name": ...}}``; (None, None) unset."""
    if isinstance(value, dict) and "status" in value:
        if "PENDING" in (value.get("status") or ()):
            return None, None
        signal = value.get("signal")
        return json_number(value.get("return_code")) or 0, json_number(
            signal.get("id") if isinstance(signal, dict) else signal) or 0
    raw = json_number(value)
    return (None, None) if raw is None else decode_wait_status(raw)


def json_job_state(value: object) -> str:
    """JSON ``job_state`` -> the state ``scontrol show job`` prints: a string (22.05, 23.02) as it is; a list (23.11+:
    the base state first, then its flags) -> the first of :data:`_STATE_FLAGS` present, else the base state."""
    if not isinstance(value, list):
        return str(value or "")
    return next((f for f in _STATE_FLAGS if f in value), str(value[0]) if value else "")


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


def parse_squeue_json(text: str) -> list[JobState]:
    """``squeue --json`` (or ``scontrol show job --json``) of Slurm 22.05 to 25.11 -> one JobState per job."""
    try:
        data, why = json.loads(text), "no 'jobs' list"
    except ValueError as exc:
        data, why = None, str(exc)
    jobs = data.get("jobs") if isinstance(data, dict) else None
    if not isinstance(jobs, list):
        errors = (data.get("errors") if isinstance(data, dict) else None) or [{}]  # Slurm's own reason, if any
        why = errors[0].get("description") or errors[0].get("error") or why
        raise LaunchError(f"squeue --json output is not the expected JSON ({why}); is this Slurm >= 21.08?")
    out = []
    for job in jobs:
        state = json_job_state(job.get("job_state"))
        finished = state in FINISHED_STATES
        exit_code, signal = json_exit_code(job.get("exit_code")) if finished else (None, None)
        out.append(JobState(
            job_id=str(job["job_id"]), name=job.get("name", ""), state=state, exit_code=exit_code, signal=signal,
            reason=_none_if_none(job.get("state_reason")), nodes=tuple(expand_hostlist(job.get("nodes") or "")),
            restarts=json_number(job.get("restart_cnt")) or 0,
            start_time=parse_time(json_number(job.get("start_time")) or 0),
            end_time=parse_time(json_number(job.get("end_time")) or 0) if finished else None, source="squeue"))
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


def parse_sacct(text: str) -> dict[str, JobState]:
    """``sacct -X -D -n -P -o`` :data:`SACCT_FIELDS` -> the newest record of each job id; ``restarts`` = the
    not-final records (``REQUEUED``) just before it (an older job that reused the id ended in a final state)."""
    rows: dict[str, list[dict[str, str]]] = {}
    for line in text.splitlines():
        parts = line.split("|", len(SACCT_FIELDS) - 1)
        if len(parts) == len(SACCT_FIELDS) and parts[0] and "." not in parts[0]:  # steps have JobID 12.batch
            rows.setdefault(parts[0], []).append(dict(zip(SACCT_FIELDS, parts)))
    out: dict[str, JobState] = {}
    for job_id, runs in rows.items():
        states = [r["State"].split(" ")[0] for r in runs]  # "CANCELLED by 1000"
        restarts = len(list(itertools.takewhile(lambda st: st not in FINISHED_STATES, reversed(states[:-1]))))
        last, state = runs[-1], states[-1]
        exit_code, signal = parse_exit_code(last["ExitCode"]) if state in FINISHED_STATES else (None, None)
        nodes = _none_if_none(last["NodeList"]) if last["NodeList"] != "None assigned" else None
        out[job_id] = JobState(
            job_id=job_id, name=last["JobName"], state=state, exit_code=exit_code, signal=signal,
            reason=_none_if_none(last["Reason"]), nodes=tuple(expand_hostlist(nodes or "")), restarts=restarts,
            start_time=parse_time(last["Start"]),
            end_time=parse_time(last["End"]) if state in FINISHED_STATES else None, source="sacct")
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
    """The job as the controller knows it (``scontrol show job -o``); after it left the controller, its record in
    the accounting database (sacct, where ``AccountingStorageType`` is slurmdbd), else its jobcomp/filetxt record
    (``jobcomp_path``, default the cluster's ``JobCompLoc``). ``env`` holds the client variables
    (``SLURM_CONF``...), merged over ``os.environ``."""
    proc = run_slurm(["scontrol", "show", "job", "-o", str(job_id)], env, check=False)
    if proc.returncode == 0 and proc.stdout.strip():
        return parse_scontrol_job(proc.stdout)
    if not any(s in proc.stderr for s in _UNKNOWN_JOB):
        raise LaunchError(f"`scontrol show job {job_id}` failed: {last_line(proc.stderr)}")
    config = {} if jobcomp_path else slurm_config(env)
    sacct_note = ""
    if config.get("AccountingStorageType") == "accounting_storage/slurmdbd":
        argv = ["sacct", "-j", str(job_id), "-X", "-D", "-n", "-P", "-o", ",".join(SACCT_FIELDS)]
        sacct = run_slurm(argv, env, check=False)
        record = parse_sacct(sacct.stdout).get(str(job_id)) if sacct.returncode == 0 else None
        if record is not None:
            return record
        sacct_note = (f"; sacct failed: {last_line(sacct.stderr)}" if sacct.returncode
                      else "; the accounting database (sacct) has no record of it")
    path = Path(jobcomp_path) if jobcomp_path else _jobcomp_of(config)
    if path is None:
        raise JobGone(f"Slurm job {job_id} is unknown to the controller, which forgets a job MinJobAge after its end, and "
                      f"this cluster keeps no completion log (JobCompType is not jobcomp/filetxt){sacct_note}")
    record = parse_jobcomp(path.read_text(errors="replace") if path.exists() else "").get(str(job_id))
    if record is None:
        raise JobGone(f"Slurm job {job_id} is unknown to the controller and not in {path}; check the job id")
    return record


def list_jobs(env: Mapping[str, str] | None = None) -> list[JobState]:
    """Every job the controller knows (``squeue --json``)."""
    return parse_squeue_json(run_slurm(["squeue", "--json"], env).stdout)


def query_nodes(env: Mapping[str, str] | None = None) -> list[NodeInfo]:
    return parse_nodes(run_slurm(["scontrol", "show", "node", "-o"], env).stdout)


def slurm_config(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``scontrol show config`` as a dict (``JobCompType``, ``AccountingStorageType``...)."""
    kv: dict[str, str] = {}
    for line in run_slurm(["scontrol", "show", "config"], env).stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            kv[key.strip()] = value.strip()
    return kv


def find_jobcomp(env: Mapping[str, str] | None = None) -> Path | None:
    """JobCompLoc of the cluster when it runs jobcomp/filetxt (the only completion log we can read); else None."""
    return _jobcomp_of(slurm_config(env))


def _jobcomp_of(config: Mapping[str, str]) -> Path | None:
    if config.get("JobCompType") != "jobcomp/filetxt" or not config.get("JobCompLoc"):
        return None
    return Path(config["JobCompLoc"])


# -- helpers ---------------------------------------------------------------------------------------

def _none_if_none(value: str | None) -> str | None:
    return None if value in (None, "", "(null)", "None") else value
