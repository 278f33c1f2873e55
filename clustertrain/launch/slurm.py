"""Slurm backend: one batch job per model's run, rendered by :mod:`clustertrain.launch.sbatch`.

:class:`SlurmLauncher` implements the :class:`~clustertrain.launch.backend.Launcher` protocol:
``submit`` writes the script to ``RUN_DIR/jobs/``, runs ``sbatch --parsable`` (returns as soon as the
job is queued) and adds a record to ``RUN_DIR/jobs.jsonl`` (:mod:`clustertrain.core.job_records`);
``status`` asks the controller (``scontrol show job``) and, after the job left it, the
jobcomp/filetxt log (:func:`clustertrain.launch.slurm_query.query_job`); where the cluster keeps none
(ParallelCluster: ``jobcomp/none``, ``MinJobAge=300``) the run directory's own records answer: the end
marker the batch script wrote (:func:`clustertrain.core.job_records.read_end_marker`), else the state an
earlier ``status`` recorded in ``jobs.jsonl``; a job that left neither (killed without warning) is
FAILED with ``detail`` saying so. ``logs`` reads (or follows)
the job's output file; ``cancel`` runs ``scancel``. Client commands run through
:func:`clustertrain.launch.slurmcli.run_slurm` with ``os.environ`` plus ``env`` (``SLURM_CONF``...), so
jobs inherit that environment (sbatch's default ``--export=ALL``).

State mapping to :class:`JobStatus` (a :class:`clustertrain.core.states.State`): PENDING/REQUEUED/CONFIGURING ->
PENDING; RUNNING/COMPLETING/SUSPENDED -> RUNNING; COMPLETED -> COMPLETED when the run's ``COMPLETED``
marker is there, STOPPED when its ``status.json`` says the ranks stopped on a signal (no segment or failure
restart left), else COMPLETED (the batch script exited 0); PREEMPTED -> STOPPED; CANCELLED -> CANCELLED;
everything else that ended (FAILED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY...) -> FAILED. ``extra["reason"]`` is Slurm's
``Reason`` (why a pending job waits: ``Resources``, ``Priority``, ``BeginTime``...). ``extra["restarts"]`` is the
run's restarts so far (both kinds: continuations and failure restarts), the ``restart N`` the batch script prints
at every start: this job's requeues plus
the resubmissions before it (a job the batch script submitted after a failure carries on its predecessor's count + 1,
from that predecessor's end marker: :func:`resubmissions_before`). ``jobs.jsonl`` records a job's own requeues.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from clustertrain.core.errors import LaunchError
from clustertrain.launch.backend import JobStatus
from clustertrain.launch.config import LaunchConfig
from clustertrain.launch.prepare import run_dir_for
from clustertrain.core.job_records import (JobRecord, add_record, find_record, new_script_path, read_end_marker,
                                           read_records, update_record)
from clustertrain.launch.sbatch import SbatchRequest, build_request, render_script, with_container_view
from clustertrain.launch.slurm_cluster_paths import local_cluster_of
from clustertrain.launch.slurm_query import JobGone, JobState, parse_kv_line, query_job
from clustertrain.launch.slurmcli import require_slurm, run_slurm
from clustertrain.project import Project
from clustertrain.core.run_paths import RunPaths, write_atomic
from clustertrain.core.run_records import RunStatus, is_completed, read_status
from clustertrain.core.states import State

if TYPE_CHECKING:
    from clustertrain.core.run_lease import Taken
    from clustertrain.launch.prepare import RunSpec

POLL_S = 0.2
_PENDING = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "RESV_DEL_HOLD", "SPECIAL_EXIT"}
_RUNNING = {"RUNNING", "COMPLETING", "SUSPENDED", "STAGE_OUT", "SIGNALING", "RESIZING", "STOPPED"}


def to_job_status(state: JobState, run_status: RunStatus | None = None, completed: bool = False) -> JobStatus:
    """Slurm's view of a job -> the backend-neutral :class:`JobStatus` (mapping in the module docstring);
    ``run_status`` is the run's ``status.json``, ``completed`` whether its ``COMPLETED`` marker is there."""
    s = state.state
    if s in _PENDING:
        mapped = State.PENDING
    elif s in _RUNNING:
        mapped = State.RUNNING
    elif s == "COMPLETED":
        stopped = not completed and run_status is not None and run_status.state == State.STOPPED
        mapped = State.STOPPED if stopped else State.COMPLETED
    elif s == "PREEMPTED":
        mapped = State.STOPPED
    elif s == "CANCELLED":
        mapped = State.CANCELLED
    else:
        mapped = State.FAILED
    detail = s if not state.reason else f"{s} ({state.reason})"
    exit_code = state.exit_code if state.exit_code is None or not state.signal else 128 + state.signal
    return JobStatus(state.job_id, mapped, exit_code, detail, {
        "slurm_state": s, "restarts": state.restarts, "nodes": list(state.nodes), "name": state.name,
        "source": state.source, "reason": state.reason})


class SlurmLauncher:
    """Submits and tracks Slurm batch jobs (one per model's run)."""

    def __init__(self, env: Mapping[str, str] | None = None, launch: LaunchConfig | None = None,
                 jobcomp_path: Path | None = None, submit_command: str | None = None,
                 unreachable: str | None = None) -> None:
        self.env = dict(env or {})
        self.unreachable = unreachable  # why no controller answers (a status check found it): status() asks nothing
        self.launch = launch
        self.jobcomp_path = jobcomp_path
        self.submit_command = submit_command
        self.runs: dict[str, RunPaths] = {}  # job id -> run dir, for jobs submitted or attached here

    # -- the Launcher protocol --------------------------------------------------------------------

    def submit(self, spec: "RunSpec") -> str:
        return self.submit_request(spec.paths, self.request_for(spec.project, spec), lease=spec.lease)

    def status(self, job_id: str) -> JobStatus:
        paths = self.runs.get(str(job_id))
        if self.unreachable:
            raise LaunchError(self.unreachable)
        try:
            state = query_job(job_id, self.env, jobcomp_path=self.jobcomp_path)
        except JobGone:
            if paths is None:
                raise
            state = state_from_run(paths, str(job_id))
        before = resubmissions_before(paths, str(job_id)) if paths is not None else 0
        # the end marker says the batch script's RESTARTS (requeues + resubmissions); every other source, requeues
        requeues = max(0, state.restarts - before) if state.source == "end-marker" else state.restarts
        state = replace(state, restarts=requeues + before)
        ended = paths is not None and state.finished
        status = to_job_status(state, read_status(paths) if ended else None, ended and is_completed(paths))
        if paths and state.finished:
            record = find_record(paths, str(job_id))
            if record is not None and record.state != state.state:
                update_record(paths, str(job_id), state=state.state, exit_code=status.exit_code,
                              restarts=requeues, ended=state.end_time.timestamp() if state.end_time else time.time())
        elif paths:
            record = find_record(paths, str(job_id))
            if record is not None and record.restarts != requeues:
                update_record(paths, str(job_id), restarts=requeues)
        return status

    def logs(self, job_id: str, follow: bool = False) -> Iterator[str]:
        """The lines of the job's output file; with ``follow``, new lines as they come until the job ended
        (a requeued job appends to the same file, so following spans its restarts)."""
        path = self.output_of(job_id)
        offset, partial = 0, ""
        while True:
            finished = not follow or self.status(job_id).finished
            try:
                with open(path, "r", encoding="utf-8", errors="replace") as f:
                    f.seek(offset)
                    data = f.read()
                    offset = f.tell()
            except FileNotFoundError:
                data = ""
            lines = (partial + data).split("\n")
            partial = lines.pop()
            yield from lines
            if finished:
                if partial:
                    yield partial
                return
            time.sleep(POLL_S)

    def queued_line(self, job_id: str, follow: bool = False) -> str | None:
        """One line when the job waits in the queue (what ``logs`` says instead of printing nothing): its Slurm
        reason, its restarts so far and whether it wrote output before (a requeued job appends to the same file);
        None when it does not wait."""
        status = self.status(job_id)
        if status.state != State.PENDING:
            return None
        extra = status.extra or {}
        reason = f" ({extra['reason']})" if extra.get("reason") else ""
        restarts = int(extra.get("restarts") or 0)
        again = f" again after restart {restarts}" if restarts else ""
        try:
            wrote = self.output_of(job_id).stat().st_size > 0
        except (OSError, LaunchError):
            wrote = False
        said = "its output so far follows" if wrote else "no output yet"
        then = "following it until the job ends" if follow else "--follow waits for it"
        return f"job {job_id} is queued{again}{reason}: {said}; {then}"

    def cancel(self, job_id: str) -> None:
        self._client(["scancel", str(job_id)])

    # -- beyond the protocol ----------------------------------------------------------------------

    def request_for(self, project: Project, spec: "RunSpec", job_name: str | None = None,
                    nodes: int | None = None, exclude: tuple[str, ...] = ()) -> SbatchRequest:
        return self.for_this_slurm(build_request(project, spec.entry, spec.paths.root, launch=self.launch,
                                                 job_name=job_name, nodes=nodes, data=spec.data,
                                                 submit_command=self.submit_command, exclude=exclude))

    def for_this_slurm(self, request: SbatchRequest) -> SbatchRequest:
        """``request`` as this launcher's Slurm runs it: clustertrain's local Slurm has no Pyxis, so there the ranks
        run in the stand-in view of the same container (:func:`~clustertrain.launch.sbatch.with_container_view`)."""
        if request.container_image and local_cluster_of(self.env) is not None:
            return with_container_view(request)
        return request

    def submit_request(self, paths: RunPaths, request: SbatchRequest, text: str | None = None,
                       lease: "Taken | None" = None) -> str:
        """Write the script of ``request`` (``text``: that script as already rendered), sbatch it, record the job;
        return the job id. ``lease``: this process's lease on the run directory (``RunSpec.lease``), handed to the job
        once it is queued (:mod:`clustertrain.core.run_lease`)."""
        script = new_script_path(paths)
        write_atomic(script, render_script(request) if text is None else text)
        request.log_dir.mkdir(parents=True, exist_ok=True)  # Slurm does not create the output directory
        proc = self._client(["sbatch", "--parsable", f"--chdir={paths.root}", str(script)])
        job_id = proc.stdout.strip().split(";")[0]
        if not job_id.isdigit():
            raise LaunchError(f"sbatch printed {proc.stdout.strip()!r}, not a job id")
        final = script.with_name(f"{script.stem}-{job_id}.sbatch")
        os.replace(script, final)  # a rename of the complete script written above (nothing half-written)
        add_record(paths, JobRecord(job_id=job_id, model=request.model, job_name=request.job_name,
                                    script=str(final), output=str(request.output_for(job_id)), submitted=time.time()))
        self.runs[job_id] = paths
        if lease is not None:
            lease.hand_to_job(job_id)  # the run directory is the job's now (and its chain's)
        return job_id

    def attach(self, paths: RunPaths, job_id: str | None = None) -> str:
        """Track a job recorded in ``paths`` (the newest one by default); return its id."""
        record = find_record(paths, job_id)
        if record is None:
            what = f"job {job_id}" if job_id else "any job"
            raise LaunchError(f"{paths.jobs}: no record of {what}; submit with `clustertrain submit PROJECT` first")
        self.runs[record.job_id] = paths
        return record.job_id

    def output_of(self, job_id: str) -> Path:
        paths = self.runs.get(str(job_id))
        record = find_record(paths, str(job_id)) if paths else None
        if record is not None:
            return Path(record.output)
        proc = self._client(["scontrol", "show", "job", "-o", str(job_id)], check=False)
        out = parse_kv_line(proc.stdout).get("StdOut") if proc.returncode == 0 else None
        if not out:
            raise LaunchError(f"no output file known for job {job_id}: it has no record in a run directory "
                              "and the controller no longer knows it; pass the project and --model")
        return Path(out)

    def wait(self, job_id: str, timeout: float | None = None, poll: float = POLL_S) -> JobStatus:
        """Poll until the job has ended (a requeued job has not: it is PENDING again)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.status(job_id)
            if status.finished:
                return status
            if deadline is not None and time.monotonic() > deadline:
                raise LaunchError(f"Slurm job {job_id} did not end within {timeout:.0f} s (state {status.detail})")
            time.sleep(poll)

    def _client(self, argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
        return run_slurm(argv, env=self.env, check=check)


def resubmissions_before(paths: RunPaths, job_id: str) -> int:
    """The restarts before job ``job_id`` began: when the batch script of an earlier job of the run submitted it after a
    failure (that job's end marker names it as ``next_job``), that job's restarts + 1 (the ``CLUSTERTRAIN_RESTARTS``
    it was given); else 0 (a job ``submit`` queued starts the count afresh)."""
    for record in read_records(paths):
        if record.job_id == job_id:
            continue
        marker = read_end_marker(paths, record.job_id)
        if marker is not None and marker.next_job == job_id:
            return marker.restarts + 1
    return 0


def state_from_run(paths: RunPaths, job_id: str) -> JobState:
    """A job Slurm has forgotten, from the run directory: the batch script's end marker, else the final state
    an earlier ``status`` recorded, else FAILED (the job ended without a chance to record it)."""
    record = find_record(paths, job_id)
    name = record.job_name if record else ""
    end = read_end_marker(paths, job_id)
    if end is not None:
        ended = datetime.fromtimestamp(end.ended) if end.ended is not None else None
        return JobState(job_id, name, end.state, exit_code=end.exit_code, signal=0, restarts=end.restarts,
                        end_time=ended, source="end-marker")
    if record is not None and record.state:
        ended = datetime.fromtimestamp(record.ended) if record.ended else None
        return JobState(job_id, name, record.state, exit_code=record.exit_code, signal=0, restarts=record.restarts,
                        end_time=ended, source="jobs.jsonl")
    if record is None:
        raise LaunchError(f"Slurm job {job_id} is unknown to the controller and {paths.jobs} has no record of it; "
                          "check the job id")
    return JobState(job_id, name, "FAILED", reason="ended without an end marker: Slurm has forgotten the job and its "
                    "batch script was killed before it could record its end (node failure or SIGKILL)",
                    restarts=record.restarts, source="run-dir")


def slurm_problem(project: Project, env: Mapping[str, str] | None = None) -> str | None:
    """For a ``backend: slurm`` project, why no Slurm controller answers (one line naming SLURM_CONF and the fix,
    :func:`~clustertrain.launch.slurmcli.slurm_unreachable`); None when one does or the project runs locally."""
    from clustertrain.launch.slurmcli import slurm_unreachable

    return slurm_unreachable(env) if project.cluster.backend == "slurm" else None


def require_reachable(project: Project, env: Mapping[str, str] | None = None) -> None:
    """:class:`~clustertrain.launch.slurmcli.SlurmUnreachable` (one line) when :func:`slurm_problem` finds one:
    what ``logs`` and ``cancel`` run before anything else."""
    from clustertrain.launch.slurmcli import SlurmUnreachable

    problem = slurm_problem(project, env)
    if problem:
        raise SlurmUnreachable(problem)


@dataclass
class Submitted:
    model: str
    run_dir: Path
    job_id: str | None  # None for a dry run
    script: str
    notes: tuple[str, ...] = ()  # one line each: suspect nodes excluded or not (clustertrain.launch.exclusion)


def submit_project(project: Project, model: str | None, run_dir: Path | None, resume: bool,
                   launcher: SlurmLauncher, dry_run: bool = False) -> list[Submitted]:
    """Submit one job per model (``model``: just that one), each on its node count
    (:func:`clustertrain.plan.node_counts.nodes_for`). Refused, before anything is written, when the plan finds a
    chosen model infeasible for its framework or a launch check fails (one line per problem, naming the field), or
    when no Slurm controller answers (:func:`~clustertrain.launch.slurmcli.require_slurm`, one line).
    Every run is prepared (and so checked) before the first sbatch; the jobs are queued back to back and run
    concurrently when the cluster has room. ``dry_run`` renders the scripts without touching a run directory or
    the cluster (after the same checks)."""
    if project.cluster.backend != "slurm":
        raise LaunchError(f"cluster.backend is {project.cluster.backend!r}: `submit` sends Slurm jobs; set "
                          "cluster.backend: slurm (or --set cluster.backend=slurm), or use `clustertrain run`")
    entries = [project.model(model)] if model else list(project.models)
    nodes = check_submittable(project, [e.name for e in entries], launcher.launch)
    several = len(entries) > 1
    if dry_run:
        out = []
        for entry in entries:
            root = run_dir_for(project, entry, run_dir, several)
            request = launcher.for_this_slurm(build_request(project, entry, root, launch=launcher.launch,
                                                            nodes=nodes[entry.name], submit_command=launcher.submit_command))
            out.append(Submitted(entry.name, root, None, render_script(request)))
        return out
    from clustertrain.launch.prepare import prepare_run

    from clustertrain.launch.exclusion import exclusions

    require_slurm(launcher.env)  # no controller: one line, before a run directory is prepared or a script written

    from clustertrain.core.run_lease import squeue_state

    def slurm_state(job: str) -> str | None:  # the lease's holder, asked of this launcher's cluster
        return squeue_state(job, dict(launcher.env))

    specs: list[RunSpec] = []
    try:  # each run directory's lease is this process's until its job is queued, then the job's
        for e in entries:
            specs.append(prepare_run(project, e, run_dir_for(project, e, run_dir, several), resume=resume,
                                     command="submit", slurm_state=slurm_state))
        excluded = {spec.entry.name: exclusions(project, launcher.env, nodes[spec.entry.name]) for spec in specs}
        requests = [launcher.request_for(project, spec, nodes=nodes[spec.entry.name],
                                         exclude=tuple(excluded[spec.entry.name].exclude)) for spec in specs]
        out = []
        for spec, request in zip(specs, requests):
            job_id = launcher.submit_request(spec.paths, request, lease=spec.lease)
            notes = tuple(n for n in (spec.lease.note if spec.lease else None,) if n)
            out.append(Submitted(spec.entry.name, spec.paths.root, job_id, str(find_record(spec.paths, job_id).script),
                                 notes + tuple(excluded[spec.entry.name].notes)))
        return out
    finally:
        for spec in specs:
            if spec.lease is not None:
                spec.lease.release()  # a run whose sbatch never happened is nobody's again


def check_submittable(project: Project, models: list[str], launch: LaunchConfig | None = None) -> dict[str, int]:
    """Each model's node count, or :class:`LaunchError` with one line per error: the plan's (a model infeasible
    for its framework, models that do not fit the cluster together) and the launch checks' (interpreter,
    time limit vs the stop signal...) — :func:`clustertrain.plan.preflight.submit_blockers`,
    :func:`clustertrain.launch.preflight.launch_findings`."""
    from clustertrain.launch.preflight import launch_findings
    from clustertrain.megatron.rules import megatron_findings
    from clustertrain.plan.node_counts import nodes_for
    from clustertrain.plan.plan import make_plan
    from clustertrain.plan.preflight import submit_blockers

    plan = make_plan(project)
    errors = submit_blockers(project, models, plan)
    errors += [f for f in launch_findings(project, plan=plan, launch=launch, models=models) if f.level == "error"]
    errors += [f for f in megatron_findings(project, models) if f.level == "error"]
    if errors:
        lines = [f"{f.path}: {f.message}; fix: {f.fix}" for f in errors]
        raise LaunchError(f"submit refused ({len(errors)} problem{'s' if len(errors) > 1 else ''}):\n  " + "\n  ".join(lines))
    return nodes_for(project, plan)
