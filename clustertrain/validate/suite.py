"""The validation suite as Slurm jobs: ``run_suite(project, SuiteConfig, launcher)`` -> :class:`SuiteReport`.

Built as values first: :func:`plan_suite` gives one :class:`SuiteJob` per job (name, nodes, tasks per
node, the ``srun`` steps, the result files it must leave), :func:`render_job` renders one as a batch
script from ``launch/templates/validate.sh.j2`` (quoting by :mod:`clustertrain.launch.sbatch`).
The jobs:

* ``smoke`` — one task per node: ``$SLURMD_NODENAME $(hostname)`` and ``clustertrain validate scan
  --role compute --json``. Checks that do not apply to the project are not-applicable: GPU/EFA checks
  when ``cluster.gpus_per_node`` is 0, enroot without ``cluster.container_image``, the FSx mount check
  without ``aws.fsx``.
* ``gpu-efa`` — ``nvidia-smi --query-gpu``, ``fi_info -p efa -t FI_EP_RDM``, ``nvidia-smi nvlink -s``
  per node; not submitted (not applicable) when ``gpus_per_node`` is 0.
* ``collectives`` — ``srun python -m clustertrain validate collectives --json`` over all ranks (NCCL on
  GPU, gloo on CPU), with the project's NCCL/EFA rank environment; on NCCL also ``NCCL_DEBUG=INFO``
  (subsystems INIT,NET) into ``results/collectives/nccl-<host>-<pid>.log``, from which the transport
  verdict is read (:mod:`clustertrain.validate.transport`). The default sweep reaches the bandwidth
  bands (:func:`~clustertrain.validate.thresholds.default_max_bytes`).
* ``storage-K`` — ``clustertrain validate storage --json`` on one node, one job per place jobs write
  (:func:`storage_targets`: the shared mounts holding the storage layout's bases, then each
  ``aws.fsx[].mount_dir``; a project without shared mounts benchmarks its run directories' base).

Each job has its own time limit: :func:`run_suite` cancels a job still running past ``job_timeout_s``
(or pending past ``start_timeout_s``) and turns it into a failed verdict. Thresholds are data
(``thresholds.yaml``, :mod:`clustertrain.validate.thresholds`), looked up per instance type.

On disk, the storage layout's ``validation_dir()`` (``<outputs>/<project>/validation/``; an ``aws:``
project must have it on a shared mount, else the suite refuses naming the field), then
``<YYYYmmdd-HHMMSS>/`` (:class:`SuitePaths`) holds
``jobs/<job>.sbatch``, ``logs/<job name>-<id>.out``, ``results/<job>/`` (what the steps wrote) and
``report.json`` (:class:`SuiteReport`, ``format_version`` 1), written last and atomically.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from clustertrain import __version__
from clustertrain.errors import LaunchError
from clustertrain.launch.presets import RankEnvironment, rank_environment
from clustertrain.launch.sbatch import check_renderable, render_template, slurm_filename
from clustertrain.layout import mount_of, off_mount_problems, storage_layout
from clustertrain.project import Project
from clustertrain.validate.checks import CheckRow, Verdict, worst  # noqa: F401  (re-exported)
from clustertrain.validate.collectives import CollectivesConfig
from clustertrain.validate.probes import parse_fi_info, parse_nvidia_smi_csv
from clustertrain.validate.requirements import family_entry, load_requirements
from clustertrain.validate.results import CollectiveRun, StorageRun, ValidateError
from clustertrain.validate.scan import ScanReport
from clustertrain.validate.storagebench import StorageBenchConfig
from clustertrain.validate.thresholds import (  # noqa: F401  (re-exported)
    BandConfig, ThresholdsConfig, bandwidth_rows, default_max_bytes, load_thresholds, thresholds_key,
)
from clustertrain.validate.transport import transport_rows

FORMAT_VERSION = 1
TEMPLATE = "validate.sh.j2"
GPU_EFA_CHECKS = ("gpu", "cuda_driver", "efa", "efa_installer", "libfabric", "aws_ofi_nccl", "nccl", "cuda")
_ABSENT = re.compile(r"^absent:(\d+)$")
#: set on the NCCL collectives job, over the project's own values: what the transport verdict reads
NCCL_DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET", "NCCL_DEBUG_FILE": "nccl-%h-%p.log"}


# ----------------------------------------------------------------------------------------- config, jobs

class SuiteConfig(BaseModel):
    """How the suite runs (the CLI fills it from options)."""

    model_config = ConfigDict(extra="forbid")

    nodes: int = Field(2, ge=1, description="Nodes of each multi-node job (smoke, gpu-efa, collectives).")
    job_timeout_s: float = Field(600, gt=0, description="A job still running this long after it started is cancelled: fail.")
    start_timeout_s: float = Field(600, gt=0, description="A job still pending this long after submission is cancelled: fail.")
    collectives: CollectivesConfig | None = Field(
        None, description="Collectives benchmark (fault: rehearsal only); None: the project's default sweep "
                          "(default_collectives: up to the bandwidth bands on GPUs, 1 MiB on CPU).")
    storage: StorageBenchConfig = Field(default_factory=StorageBenchConfig, description="Storage bench per mount.")
    python: str = Field(default_factory=lambda: sys.executable, description="Python on the nodes.")


@dataclass(frozen=True)
class SuiteJob:
    """One batch job of the suite, as a value. ``outputs``: result files the steps must leave."""

    name: str
    job_name: str
    project: str
    nodes: int
    ntasks_per_node: int
    steps: tuple[tuple[str, ...], ...]
    outputs: tuple[Path, ...]
    results_dir: Path
    time_limit: str
    gpus_per_node: int = 0
    gpu_directive: str = "gpus-per-node"
    partition: str | None = None
    exclusive: bool = True
    env: RankEnvironment = field(default_factory=RankEnvironment)
    sbatch_args: tuple[str, ...] = ()
    target: str = ""  # storage jobs: the mount benchmarked
    submit_command: str = "clustertrain validate suite PROJECT"
    version: str = __version__


@dataclass(frozen=True)
class SuitePaths:
    """Every path of one suite run."""

    root: Path

    @property
    def jobs(self) -> Path:
        return self.root / "jobs"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def report(self) -> Path:
        return self.root / "report.json"

    def results(self, job: str) -> Path:
        return self.root / "results" / job

    def script(self, job: str) -> Path:
        return self.jobs / f"{job}.sbatch"

    def output(self, job: SuiteJob, job_id: str) -> Path:
        return self.logs / f"{job.job_name}-{job_id}.out"


def default_collectives(project: Project, table: ThresholdsConfig | None = None) -> CollectivesConfig:
    """The suite's default collectives sweep for ``project`` (see :func:`default_max_bytes`)."""
    table = table or load_thresholds()
    cl = project.cluster
    return CollectivesConfig(iters=10, max_bytes=default_max_bytes(
        table, thresholds_key(table, cl.instance_type, cl.gpus_per_node), cl.gpus_per_node))


def validation_base(project: Project) -> Path:
    """Where suites of ``project`` go; for an ``aws:`` project it must be on one of its shared mounts (the
    layout's rule, :func:`~clustertrain.layout.off_mount_problems`), else one line naming the field."""
    layout = storage_layout(project)
    for field_name, message in off_mount_problems(project):
        if field_name in (layout.origin["outputs"], "aws.fsx"):
            raise ValidateError(f"{field_name}: {message}")
    return layout.validation_dir()


def new_suite_dir(project: Project, now: datetime | None = None) -> SuitePaths:
    base = validation_base(project)
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    for i in range(100):
        root = base / (stamp if i == 0 else f"{stamp}-{i}")
        try:
            root.mkdir(parents=True)
            return SuitePaths(root)
        except FileExistsError:
            continue
    raise ValidateError(f"{base}: cannot make a new suite directory for {stamp}")


def storage_targets(project: Project) -> list[Path]:
    """Where the project's jobs write: without shared mounts, the run directories' base (``storage.runs``, else
    ``storage.root``); with them, the mounts holding the storage layout's bases, then each aws.fsx mount dir (once
    each). A base off every mount is not benchmarked (it would measure a node's root volume):
    :func:`validation_base` and ``clustertrain check`` refuse such a project."""
    layout = storage_layout(project)
    if not layout.mounts:
        return [layout.runs]
    held = [mount_of(b, layout.mounts) for b in layout.bases().values()]
    targets = [Path(m) for m in held if m] + [Path(f.mount_dir) for f in (project.aws.fsx if project.aws else [])]
    return list(dict.fromkeys(targets))


def _minutes(seconds: float) -> str:
    return str(int(seconds // 60) + 2)  # Slurm's own limit: a backstop behind our timeout


def _srun(nodes: int, per_node: int | None, out: Path, pattern: str, extra: tuple[str, ...] = ()) -> list[str]:
    argv = ["srun", f"--nodes={nodes}"]
    argv += [f"--ntasks-per-node={per_node}"] if per_node else ["--ntasks=1"]
    stem = slurm_filename(out) + "/" + pattern
    return [*argv, *extra, f"--output={stem}", f"--error={stem}.err"]


def plan_suite(project: Project, cfg: SuiteConfig, paths: SuitePaths,
               table: ThresholdsConfig | None = None) -> tuple[list[SuiteJob], list[str]]:
    """The jobs to submit, and the names of those that do not apply (``gpu-efa`` without GPUs)."""
    cl, launch = project.cluster, project.launch
    n, py = cfg.nodes, cfg.python
    common = dict(project=project.name, partition=cl.partition, exclusive=launch.exclusive,
                  sbatch_args=tuple(launch.sbatch_args), gpu_directive=launch.gpu_directive,
                  time_limit=_minutes(cfg.job_timeout_s))
    srun_extra = tuple(launch.srun_args)
    jobs: list[SuiteJob] = []
    skipped: list[str] = []

    res = paths.results("smoke")
    itype = ["--instance-type", cl.instance_type] if cl.instance_type else []
    jobs.append(SuiteJob(
        name="smoke", job_name=f"{project.name}-validate-smoke", nodes=n, ntasks_per_node=1, results_dir=res,
        steps=(tuple(_srun(n, 1, res, "host-%n.txt", srun_extra) + ["bash", "-c", 'echo "$SLURMD_NODENAME $(hostname)"']),
               tuple(_srun(n, 1, res, "scan-%n.json", srun_extra) + [py, "-m", "clustertrain", "validate", "scan",
                                                                     "--role", "compute", "--json", *itype])),
        outputs=tuple(res / f"{kind}-{i}.{ext}" for i in range(n) for kind, ext in (("host", "txt"), ("scan", "json"))),
        gpus_per_node=cl.gpus_per_node, **common))

    if cl.gpus_per_node:
        res = paths.results("gpu-efa")
        q = "--query-gpu=index,name,driver_version,memory.total,pci.bus_id"
        jobs.append(SuiteJob(
            name="gpu-efa", job_name=f"{project.name}-validate-gpu-efa", nodes=n, ntasks_per_node=1, results_dir=res,
            steps=(tuple(_srun(n, 1, res, "nvidia-smi-%n.csv", srun_extra) + ["nvidia-smi", q, "--format=csv"]),
                   tuple(_srun(n, 1, res, "fi_info-%n.txt", srun_extra) + ["fi_info", "-p", "efa", "-t", "FI_EP_RDM"]),
                   tuple(_srun(n, 1, res, "nvlink-%n.txt", srun_extra) + ["nvidia-smi", "nvlink", "-s"])),
            outputs=tuple(res / f"{k}-{i}.{e}" for i in range(n) for k, e in
                          (("nvidia-smi", "csv"), ("fi_info", "txt"), ("nvlink", "txt"))),
            gpus_per_node=cl.gpus_per_node, **common))
    else:
        skipped.append("gpu-efa")

    res = paths.results("collectives")
    c = cfg.collectives or default_collectives(project, table)
    backend = c.backend or ("nccl" if cl.gpus_per_node else "gloo")
    args = [py, "-m", "clustertrain", "validate", "collectives", "--json", "--ops", ",".join(c.ops),
            "--min-bytes", str(c.min_bytes), "--max-bytes", str(c.top(backend)), "--factor", str(c.factor),
            "--iters", str(c.iters), "--warmup", str(c.warmup), "--timeout", f"{c.timeout_s:g}"]
    args += ["--backend", backend]
    if c.fault and (m := _ABSENT.match(c.fault)):  # rehearsal: that rank's task exits before it joins
        wrapper = ('if [ "$SLURM_PROCID" = "$0" ]; then echo "rank $0 withheld (fault absent:$0)" >&2; exit 0; fi; '
                   'exec "$@"')
        args = ["bash", "-c", wrapper, m.group(1), *args]
    elif c.fault:
        args += ["--fault", c.fault]
    env = rank_environment(cl.instance_type, n, launch, os=project.aws.os if project.aws else None,
                           container=bool(cl.container_image))
    if not cl.gpus_per_node:
        env = RankEnvironment({**env.set, "OMP_NUM_THREADS": env.set.get("OMP_NUM_THREADS", "1")}, env.prepend,
                              env.family, env.scale, env.efa)
    if backend == "nccl":  # the transport verdict reads these logs (relative: the script runs in $RESULTS)
        env = RankEnvironment({**env.set, **NCCL_DEBUG_ENV}, env.prepend, env.family, env.scale, env.efa)
    jobs.append(SuiteJob(
        name="collectives", job_name=f"{project.name}-validate-collectives", nodes=n, results_dir=res,
        ntasks_per_node=cl.ranks_per_node, outputs=(res / "collectives-0.json",), env=env,
        steps=(tuple(_srun(n, cl.ranks_per_node, res, "collectives-%t.json", ("--kill-on-bad-exit=1", *srun_extra))
                     + args),),
        gpus_per_node=cl.gpus_per_node, **common))

    s = cfg.storage
    for k, target in enumerate(storage_targets(project), 1):
        res = paths.results(f"storage-{k}")
        jobs.append(SuiteJob(
            name=f"storage-{k}", job_name=f"{project.name}-validate-storage-{k}", nodes=1, ntasks_per_node=1,
            results_dir=res, outputs=(res / "storage.json",), target=str(target),
            steps=(tuple(_srun(1, None, res, "storage.json", srun_extra)
                         + [py, "-m", "clustertrain", "validate", "storage", str(target), "--size", f"{s.size_mib}M",
                            "--files", str(s.files), "--engine", s.engine, "--cache", s.cache, "--json"]),),
            **common))
    for job in jobs:
        for f in ("job_name", "steps", "results_dir", "target", "partition", "sbatch_args"):
            check_renderable(f"{job.name}: {f}", getattr(job, f))
    return jobs, skipped


def render_job(job: SuiteJob, paths: SuitePaths) -> str:
    """The batch script of one suite job."""
    output = slurm_filename(paths.logs) + "/%x-%j.out"
    check_renderable("log directory", output)
    return render_template(TEMPLATE, j=job, steps=[list(s) for s in job.steps], output=output)


# ----------------------------------------------------------------------------------------- report

class JobOutcome(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(description="Suite job name.")
    job_id: str | None = Field(default=None, description="Slurm job id (None: not submitted).")
    state: str = Field(description="Final state: COMPLETED, FAILED, TIMEOUT (ours), NOT_STARTED, SKIPPED...")
    exit_code: int | None = Field(default=None, description="Exit status of the batch script.")
    elapsed_s: float | None = Field(default=None, description="Seconds from submission to the end.")
    script: str | None = Field(default=None, description="The batch script.")
    output: str | None = Field(default=None, description="The job's output file.")


class SuiteReport(BaseModel):
    """``report.json``."""

    model_config = ConfigDict(extra="ignore")
    format_version: int = Field(default=FORMAT_VERSION, description="Version of this JSON layout.")
    project: str = Field(description="Project name.")
    nodes: int = Field(description="Nodes per multi-node job.")
    instance_type: str | None = Field(description="cluster.instance_type.")
    thresholds: str = Field(description="thresholds.yaml entry used.")
    directory: str = Field(description="Suite directory (scripts, logs, results).")
    started: str = Field(description="Start time, ISO 8601.")
    jobs: list[JobOutcome] = Field(default_factory=list, description="One per job.")
    rows: list[CheckRow] = Field(default_factory=list, description="One per check.")
    failed: bool = Field(default=False, description="Any check failed.")

    def finish(self) -> SuiteReport:
        self.failed = any(r.verdict == "fail" for r in self.rows)
        return self


# ----------------------------------------------------------------------------------------- evaluation

def evaluate_smoke(project: Project, nodes: list[str], hosts: list[str | None],
                   scans: list[ScanReport | None]) -> list[CheckRow]:
    """One row for the nodes that answered, then one per scan check (worst over nodes)."""
    answered = [f"{h}" for h in hosts if h]
    rows = [CheckRow(job="smoke", check="nodes", verdict="pass" if len(answered) == len(hosts) and
                     all(scans) else "fail", found=f"{len(answered)}/{len(hosts)}: {', '.join(answered)}",
                     threshold=f"{len(hosts)} node(s) answer with a scan", detail=" ".join(
                         f"{nodes[i] if i < len(nodes) else i}: no scan result" for i, s in enumerate(scans) if s is None))]
    names = list(dict.fromkeys(c.name for s in scans if s for c in s.checks))
    for name in names:
        per = [(nodes[i] if i < len(nodes) else str(i), c) for i, s in enumerate(scans) if s
               for c in s.checks if c.name == name]
        na = _not_applicable(project, name)
        if na:
            rows.append(CheckRow(job="smoke", check=name, verdict="not-applicable", found=per[0][1].found,
                                 threshold=per[0][1].required, detail=na))
            continue
        verdict = worst([c.status for _, c in per])
        founds = {c.found for _, c in per}
        found = per[0][1].found if len(founds) == 1 else "; ".join(f"{n}: {c.found}" for n, c in per)
        detail = "; ".join(f"{n}: {c.detail}" for n, c in per if c.status != "pass" and c.detail)
        rows.append(CheckRow(job="smoke", check=name, verdict=verdict, found=found, threshold=per[0][1].required,
                             detail=detail[:300]))
    return rows


def _not_applicable(project: Project, check: str) -> str | None:
    cl = project.cluster
    if check in GPU_EFA_CHECKS and cl.gpus_per_node == 0:
        return "not applicable: gpus_per_node=0"
    if check == "enroot" and not cl.container_image:
        return "not applicable: cluster.container_image is not set"
    if check == "shared_fs" and not (project.aws and project.aws.fsx):
        return "not applicable: no aws.fsx; storage.root is benchmarked by the storage job"
    return None


def evaluate_gpu_efa(project: Project, nodes: list[str], smi: list[str | None], fi: list[str | None],
                     nvlink: list[str | None]) -> list[CheckRow]:
    """GPU count (cluster.gpus_per_node), EFA devices (requirements.yaml family), NVLink links up."""
    fam_name, fam = family_entry(load_requirements(), project.cluster.instance_type)
    rows = []
    for i, node in enumerate(nodes):
        gpus = parse_nvidia_smi_csv(smi[i] or "") if i < len(smi) else []
        need = project.cluster.gpus_per_node
        rows.append(CheckRow(job="gpu-efa", check=f"gpus {node}", verdict="pass" if len(gpus) >= need else "fail",
                             found=f"{len(gpus)} x {gpus[0].get('name') if gpus else '-'}", threshold=f">= {need} GPU(s)",
                             detail="" if gpus else "nvidia-smi gave no GPU rows"))
        efa = [b for b in parse_fi_info(fi[i] or "" if i < len(fi) else "") if b.get("provider") == "efa"]
        rows.append(CheckRow(job="gpu-efa", check=f"efa {node}", verdict="pass" if len(efa) >= fam.efa_devices else "fail",
                             found=f"{len(efa)} EFA device(s)", threshold=f">= {fam.efa_devices} ({fam_name})",
                             detail="fi_info -p efa -t FI_EP_RDM"))
        text = nvlink[i] if i < len(nvlink) else None
        up = len(re.findall(r"Link \d+: [\d.]+ GB/s", text or ""))
        down = len(re.findall(r"Link \d+: <inactive>", text or ""))
        verdict = "fail" if down else ("pass" if up else "warn")
        rows.append(CheckRow(job="gpu-efa", check=f"nvlink {node}", verdict=verdict, found=f"{up} up, {down} inactive",
                             threshold="no inactive link", detail="nvidia-smi nvlink -s" + ("" if up or down else
                                                                                            ": no links listed")))
    return rows


def evaluate_collectives(run: CollectiveRun, expected_ranks: int, nodes: int, table: ThresholdsConfig,
                         key: str, timeout_s: float) -> list[CheckRow]:
    """Ranks, per-op correctness (and completion within the per-op timeout), busbw bands of ``key``."""
    rows = [CheckRow(job="collectives", check="ranks", verdict="pass" if run.world_size == expected_ranks else "fail",
                     found=str(run.world_size), threshold=f"{expected_ranks} ranks", detail=run.backend or "")]
    op_problems = {p for rep in run.reports for p in rep.problems}
    general = [p for p in run.problems if not any(p.endswith(q) for q in op_problems)]
    if general:
        rows.append(CheckRow(job="collectives", check="run", verdict="fail", found="; ".join(general)[:300],
                             threshold=f"every rank joins and reports within {timeout_s:g}s"))
    for rep in run.reports:
        wrong = sum(r.wrong or 0 for r in rep.rows)
        rows.append(CheckRow(job="collectives", check=f"{rep.op} correctness", verdict="fail" if rep.failed else "pass",
                             found=f"{len(rep.rows)} size(s), {wrong} wrong", threshold=f"exact results, each op < {timeout_s:g}s",
                             detail="; ".join(rep.problems)[:300]))
    return rows + bandwidth_rows(run, nodes, table, key)


def evaluate_storage(job: str, project: Project, run: StorageRun, table: ThresholdsConfig) -> list[CheckRow]:
    """Bench ran cleanly; on an FSx mount, throughput >= the FSx rule (thresholds.yaml ``fsx``)."""
    rows = []
    for res in run.results:
        fsx = next((f for f in (project.aws.fsx if project.aws else [])
                    if Path(res.target).is_relative_to(f.mount_dir)), None)
        need, thr = None, "measured, no error"
        if fsx is not None and fsx.effective_throughput:
            baseline = fsx.effective_throughput * fsx.capacity_gb / 1024 * 1e6 / (1 << 20)  # MB/s/TiB x TiB -> MiB/s
            need = min(baseline, table.fsx.client_cap_mib_s) * table.fsx.min_fraction
            thr = f">= {need:.0f} MiB/s ({fsx.name}: {fsx.effective_throughput} MB/s/TiB x {fsx.capacity_gb} GiB)"
        for what, val in (("write", res.write_mib_s), ("read", res.read_mib_s)):
            verdict = "fail" if val is None else ("fail" if need is not None and val < need else "pass")
            cached = what == "read" and res.cache_bypass == "none"
            rows.append(CheckRow(job=job, check=f"{what} {res.target}", verdict="warn" if cached and verdict == "pass"
                                 else verdict, found="-" if val is None else f"{val:.0f} MiB/s", threshold=thr,
                                 detail=f"{res.tool}, page cache: {res.cache_bypass or 'not recorded'}" + (
                                     " (read may come from memory)" if cached else "")))
        md = [res.create_per_s, res.stat_per_s, res.unlink_per_s]
        rows.append(CheckRow(job=job, check=f"metadata {res.target}", verdict="fail" if None in md else "pass",
                             found="-" if None in md else "create {:.0f}/s, stat {:.0f}/s, unlink {:.0f}/s".format(*md),
                             threshold="measured"))
    if run.problems or not run.results:
        rows.append(CheckRow(job=job, check="bench", verdict="fail", found="; ".join(run.problems)[:300] or "no result",
                             threshold="no error"))
    for w in run.warnings:
        rows.append(CheckRow(job=job, check="bench", verdict="pass", found=w[:200], detail="note"))
    return rows


# ----------------------------------------------------------------------------------------- running

def partition_nodes(env: dict[str, str], partition: str | None) -> int | None:
    """Nodes in the partition (all partitions without one) per ``sinfo``; None when Slurm does not answer."""
    argv = ["sinfo", "-h", "-o", "%D %P"] + (["-p", partition] if partition else [])
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **env}, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    counts = [int(line.split()[0]) for line in proc.stdout.splitlines() if line.split() and line.split()[0].isdigit()]
    return sum(counts) if proc.returncode == 0 and counts else None


def resolve_nodes(nodes: str, project: Project, available: int | None) -> int:
    """``--nodes``: a count, or ``all`` (the partition's nodes, else cluster.nodes)."""
    where = f"partition {project.cluster.partition}" if project.cluster.partition else "the cluster"
    if nodes == "all":
        return available or project.cluster.nodes
    if not nodes.isdigit() or int(nodes) < 1:
        raise ValidateError(f"--nodes {nodes!r}: give a node count (2, 10...) or 'all'")
    if available is not None and int(nodes) > available:
        raise ValidateError(f"--nodes {nodes}: {where} has only {available} node(s); use --nodes {available} or 'all'")
    return int(nodes)


def _sbatch(script: Path, env: dict[str, str], cwd: Path) -> str:
    try:
        proc = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True,
                              env={**os.environ, **env}, cwd=cwd, timeout=60)
    except FileNotFoundError:
        raise LaunchError("`sbatch` not found: install the Slurm client or fix PATH (for the local cluster: "
                          "eval \"$(clustertrain local-slurm env)\")") from None
    job_id = proc.stdout.strip().split(";")[0]
    if proc.returncode != 0 or not job_id.isdigit():
        last = (proc.stderr.strip().splitlines() or ["no error output"])[-1]
        raise LaunchError(f"sbatch {script.name} failed: {last}")
    return job_id


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def _load(model, path: Path):
    text = _read(path)
    if not text or not text.strip():
        return None
    try:
        return model.model_validate_json(text[text.index("{"):])
    except (ValueError, ValidationError):
        return None


def _why_missing(job: SuiteJob, outcome: JobOutcome, paths: SuitePaths) -> str:
    errs = [_read(Path(str(o) + ".err")) or "" for o in job.outputs] + [_read(Path(outcome.output or "/-")) or ""]
    lines = [ln for text in errs for ln in text.strip().splitlines() if ln.strip()]
    return f"job {outcome.state}, exit {outcome.exit_code}: {' | '.join(lines[-2:])[:240]}"


def gather(job: SuiteJob, outcome: JobOutcome, nodes: list[str], project: Project, cfg: SuiteConfig,
           table: ThresholdsConfig, key: str, paths: SuitePaths) -> list[CheckRow]:
    """Read what ``job`` left in its results directory and judge it."""
    if outcome.state in ("TIMEOUT", "NOT_STARTED"):
        limit = cfg.job_timeout_s if outcome.state == "TIMEOUT" else cfg.start_timeout_s
        what = "still running" if outcome.state == "TIMEOUT" else "still pending"
        return [CheckRow(job=job.name, check="job", verdict="fail", found=f"{what} after {limit:g}s; cancelled",
                         threshold=f"ends within {limit:g}s", detail=f"Slurm job {outcome.job_id}")]
    rows = [CheckRow(job=job.name, check="job", verdict="pass", found=f"{outcome.state}, exit {outcome.exit_code}",
                     threshold=f"ends within {cfg.job_timeout_s:g}s", detail=f"Slurm job {outcome.job_id}" + (
                         "; a step exited non-zero: the checks below say why" if outcome.exit_code else ""))]
    if job.name == "smoke":
        hosts = [(_read(job.results_dir / f"host-{i}.txt") or "").strip() or None for i in range(job.nodes)]
        scans = [_load(ScanReport, job.results_dir / f"scan-{i}.json") for i in range(job.nodes)]
        names = [h.split()[0] if h else (nodes[i] if i < len(nodes) else str(i)) for i, h in enumerate(hosts)]
        out = evaluate_smoke(project, names, hosts, scans)
        if not all(scans):
            out[0].detail = (out[0].detail + "; " + _why_missing(job, outcome, paths)).strip("; ")
        return rows + out
    if job.name == "gpu-efa":
        texts = {k: [_read(job.results_dir / f"{k}-{i}.{e}") for i in range(job.nodes)]
                 for k, e in (("nvidia-smi", "csv"), ("fi_info", "txt"), ("nvlink", "txt"))}
        names = nodes if len(nodes) == job.nodes else [str(i) for i in range(job.nodes)]
        return rows + evaluate_gpu_efa(project, names, texts["nvidia-smi"], texts["fi_info"], texts["nvlink"])
    if job.name == "collectives":
        run = _load(CollectiveRun, job.outputs[0])
        if run is None:
            return rows + [CheckRow(job=job.name, check="result", verdict="fail", found="no JSON result",
                                    threshold="rank 0 writes its report", detail=_why_missing(job, outcome, paths))]
        logs = [_read(p) or "" for p in sorted(job.results_dir.glob("nccl-*.log"))
                + sorted(job.results_dir.glob("collectives-*.err"))]
        return rows + evaluate_collectives(run, job.nodes * job.ntasks_per_node, job.nodes, table, key,
                                           cfg.collectives.timeout_s if cfg.collectives else 60.0) + transport_rows(
            logs, backend=run.backend, efa_expected=job.env.efa, instance_type=project.cluster.instance_type)
    run = _load(StorageRun, job.outputs[0])
    if run is None:
        return rows + [CheckRow(job=job.name, check=f"bench {job.target}", verdict="fail", found="no JSON result",
                                threshold="the bench writes its report", detail=_why_missing(job, outcome, paths))]
    return rows + evaluate_storage(job.name, project, run, table)


def run_suite(project: Project, cfg: SuiteConfig, launcher, *, thresholds: ThresholdsConfig | None = None,
              poll_s: float = 0.5) -> SuiteReport:
    """Submit every job, wait (cancelling those past their limits), gather, judge, write ``report.json``.
    ``launcher``: a :class:`~clustertrain.launch.slurm.SlurmLauncher` (its ``env``, ``status``, ``cancel``)."""
    table = thresholds or load_thresholds()
    key = thresholds_key(table, project.cluster.instance_type, project.cluster.gpus_per_node)
    if cfg.collectives is None:
        cfg = cfg.model_copy(update={"collectives": default_collectives(project, table)})
    paths = new_suite_dir(project)
    jobs, skipped = plan_suite(project, cfg, paths, table)
    report = SuiteReport(project=project.name, nodes=cfg.nodes, instance_type=project.cluster.instance_type,
                         thresholds=key, directory=str(paths.root), started=datetime.now().isoformat(timespec="seconds"))
    paths.jobs.mkdir()
    paths.logs.mkdir()
    submitted: dict[str, tuple[SuiteJob, str, float]] = {}
    try:
        for job in jobs:
            job.results_dir.mkdir(parents=True, exist_ok=True)
            script = paths.script(job.name)
            script.write_text(render_job(job, paths))
            submitted[job.name] = (job, _sbatch(script, launcher.env, paths.root), time.monotonic())
        outcomes = _wait_all(submitted, cfg, launcher, paths, poll_s)
    except BaseException:
        for _, job_id, _ in submitted.values():  # never leave jobs behind on an error or Ctrl-C
            try:
                launcher.cancel(job_id)
            except LaunchError:
                pass
        raise
    for job in jobs:
        outcome, nodes = outcomes[job.name]
        report.jobs.append(outcome)
        report.rows.extend(gather(job, outcome, nodes, project, cfg, table, key, paths))
        for name in (skipped if job.name == "smoke" else []):
            report.jobs.append(JobOutcome(name=name, state="SKIPPED"))
            report.rows.append(CheckRow(job=name, check="job", verdict="not-applicable",
                                        detail=f"not applicable: gpus_per_node={project.cluster.gpus_per_node}"))
    report.finish()
    tmp = paths.report.with_name(".report.json.tmp")
    tmp.write_text(report.model_dump_json(indent=2))
    os.replace(tmp, paths.report)
    return report


def _wait_all(submitted: dict[str, tuple[SuiteJob, str, float]], cfg: SuiteConfig, launcher, paths: SuitePaths,
              poll_s: float) -> dict[str, tuple[JobOutcome, list[str]]]:
    started: dict[str, float] = {}
    done: dict[str, tuple[JobOutcome, list[str]]] = {}
    while len(done) < len(submitted):
        for name, (job, job_id, t_submit) in submitted.items():
            if name in done:
                continue
            status = launcher.status(job_id)
            now = time.monotonic()
            common = dict(name=name, job_id=job_id, script=str(paths.script(name)),
                          output=str(paths.output(job, job_id)), elapsed_s=round(now - t_submit, 2))
            nodes = list(status.extra.get("nodes") or [])
            if status.finished:
                done[name] = (JobOutcome(state=status.extra.get("slurm_state", status.state), exit_code=status.exit_code,
                                         **common), nodes)
            elif status.state == "RUNNING" and now - started.setdefault(name, now) > cfg.job_timeout_s:
                launcher.cancel(job_id)
                done[name] = (JobOutcome(state="TIMEOUT", **common), nodes)
            elif status.state == "PENDING" and now - t_submit > cfg.start_timeout_s:
                launcher.cancel(job_id)
                done[name] = (JobOutcome(state="NOT_STARTED", **common), nodes)
        if len(done) < len(submitted):
            time.sleep(poll_s)
    return done


def suite_table(report: SuiteReport):
    """A rich Table of the rows (verdict coloured)."""
    from rich.table import Table

    colour = {"pass": "green", "warn": "yellow", "fail": "bold red", "not-applicable": "dim"}
    t = Table(title=f"validation suite: {report.project} ({report.nodes} node(s), thresholds {report.thresholds})")
    for col in ("job", "check", "verdict", "found", "threshold", "detail"):
        t.add_column(col, overflow="fold")
    for r in report.rows:
        t.add_row(r.job, r.check, f"[{colour[r.verdict]}]{r.verdict}[/]", r.found, r.threshold, r.detail)
    return t
