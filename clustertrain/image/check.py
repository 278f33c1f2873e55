"""``clustertrain image check``: scan the image on one node through Pyxis and compare what it holds with the pins.

:func:`run_image_check` submits one batch job (one node, one task; the project's partition, GPUs and
``--exclusive`` as its launches have them) built with the validation suite's job machinery
(:mod:`clustertrain.validate.suitejob`). Its one step is::

    srun ... --container-image=IMAGE --no-container-mount-home --container-mounts=RESULTS:RESULTS \\
        IMAGE_PYTHON -m clustertrain validate scan --role container --json [--instance-type T]

(Pyxis flags; ``--no-container`` drops them and runs the launch interpreter: the scan then reads the node's
host). On a GPU project (``cluster.gpus_per_node`` > 0), in the image, a second step proves the transport
rather than a file: it initialises a one-rank NCCL communicator and runs one ``all_reduce``
(:data:`PROBE`) with ``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET FI_LOG_LEVEL=info`` under the job's NCCL
environment (the launch preset, :func:`clustertrain.launch.presets.rank_environment`), its output in
``results/image-check/nccl-init.log`` (and ``.err``: libfabric logs to stderr). Where the instance type uses
EFA, :func:`clustertrain.validate.transport.one_rank_rows` then requires ``Using network Libfabric`` with the
``efa`` provider (aws-ofi-nccl's ``NET/OFI`` lines), the plugin version the instance type needs, and GDRCopy
loaded by libfabric; anything else fails naming what NCCL used instead (``Using network Socket``). The mount is left out when the results directory holds ``,`` or ``:`` (Pyxis' separators): srun writes
the step's output on the host either way. The job gets ``<project>-image-check`` as its name and a new
directory under the project's validation directory, laid out as a suite's
(:class:`~clustertrain.validate.suitedir.SuitePaths`: ``jobs/``, ``logs/``, ``results/image-check/scan.json``).

Judging (pure, :func:`judge`): one :class:`ImageCheckRow` per component (cuda, nccl, aws_ofi_nccl,
libfabric, torch, and megatron with ``image.megatron``), then the transport rows of the NCCL init (``transport``,
``aws-ofi-nccl (NCCL log)``, ``gdrcopy``; their verdicts are the transport check's):

=========  ===========================================================================================
verdict    when
=========  ===========================================================================================
``fail``   the scan failed that check (missing, below the minimum), or a pinned component is not found
``warn``   the version found differs from the pin, but meets the minimum; or it could not be read
``pass``   it matches the pin on the pin's own precision (pin 13.1 matches 13.1.1, 1.22.0 matches
           1.22.0-aws, core_v0.16.1 matches megatron-core 0.16.1); without a pin: the scan's status
=========  ===========================================================================================

Pins (:func:`pins_for`) are the ``image:`` section's resolved set (:func:`clustertrain.image.versions.resolved`)
when the image checked is the one ``image build`` writes, or with ``--no-container`` (the host compared the
same way); otherwise "not pinned". Without a scan result the report fails with one message: srun's
"unrecognized option '--container-image...'" means Pyxis is not installed on the cluster (:func:`pyxis_missing`);
anything else gives the job's state and its last stderr lines.

``image-check.json`` (:class:`ImageCheckReport`, ``format_version`` 1), written last and atomically into the
job's directory: project, image checked (None: the host), container, job id, final state, node, directory,
rows, failed, message. Read back leniently (:class:`~clustertrain.core.schema.StoredModel`).
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Annotated

from pydantic import BeforeValidator, Field

from clustertrain.core.errors import ImageError, LaunchError
from clustertrain.image.versions import load_versions, resolved, vtuple
from clustertrain.project import Project
from clustertrain.core.run_paths import write_atomic
from clustertrain.core.schema import StoredModel
from clustertrain.core.states import State
from clustertrain.validate.check_rows import Verdict
from clustertrain.validate.scan import CheckResult, ScanReport
from clustertrain.validate.suitedir import JobOutcome, SuitePaths, load_result, read_text
from clustertrain.validate.transport import one_rank_rows

FORMAT_VERSION = 1
NAME = "image-check"
COMPONENTS = ("cuda", "nccl", "aws_ofi_nccl", "libfabric", "torch")
PIN_KEYS = {"megatron": "megatron_lm"}  # scan check -> versions.yaml pin, where they differ
NOT_PINNED = "not pinned"
NCCL_LOG = "nccl-init.log"
#: the variables of the NCCL init step (inside the container): what NCCL and libfabric say about the network
PROBE_ENV = ("NCCL_DEBUG=INFO", "NCCL_DEBUG_SUBSYS=INIT,NET", "FI_LOG_LEVEL=info")
#: one rank, one GPU, one all_reduce over NCCL: enough for NCCL to load its net plugin and pick a network
#: (an in-memory store: no rendezvous, no port)
PROBE = ("import torch, torch.distributed as dist; torch.cuda.set_device(0); "
         "dist.init_process_group('nccl', store=dist.HashStore(), rank=0, world_size=1); "
         "t = torch.ones(1, device='cuda'); dist.all_reduce(t); torch.cuda.synchronize(); "
         "print('allreduce ok', t.item(), 'nccl', torch.cuda.nccl.version(), flush=True); dist.destroy_process_group()")
#: srun without the Pyxis plugin: "srun: unrecognized option '--container-image=x'" (slurm-wlm 22.05.8, captured
#: in tests/unit/image/test_check_compare.py); other getopt builds say "unrecognized option `--container-...'".
_PYXIS_RE = re.compile(r"(unrecognized|unknown|invalid) option\W{1,3}--container")


class ImageCheckRow(StoredModel):
    component: str = Field(description="Scan check: cuda, nccl, aws_ofi_nccl, libfabric, torch, megatron; or a transport "
                                       "check of the NCCL init: transport, aws-ofi-nccl (NCCL log), gdrcopy.")
    pinned: str = Field(description="The pinned version, or 'not pinned'.")
    found: str = Field(description="What the scan found (its own words), or 'not found' / 'not scanned'.")
    version: str | None = Field(default=None, description="The comparable version found; None when none was read.")
    status: str = Field(description="The scan's status for the check (pass / warn / fail / not-applicable / not scanned).")
    verdict: Verdict = Field(description="pass / warn / fail / not-applicable (module docstring).")
    detail: str = Field(default="", description="Why this verdict.")


class ImageCheckReport(StoredModel):
    """``image-check.json``."""

    format_version: int = Field(default=FORMAT_VERSION, description="Version of this JSON layout.")
    project: str = Field(description="Project name.")
    image: str | None = Field(description="The image checked (Pyxis --container-image); None: the node's host was scanned.")
    container: bool = Field(description="True: scanned inside the image; False: on the host (--no-container).")
    job_id: str | None = Field(default=None, description="Slurm job id.")
    state: Annotated[State, BeforeValidator(State.parse)] = Field(
        default=State.UNKNOWN, description="The job's final state (TIMEOUT / NOT_STARTED: cancelled at --timeout).")
    node: str | None = Field(default=None, description="The node the scan ran on.")
    directory: str = Field(description="The job's directory (script, log, results, this file).")
    started: str = Field(default="", description="Start time, ISO 8601.")
    rows: list[ImageCheckRow] = Field(default_factory=list, description="One per component.")
    failed: bool = Field(default=False, description="A row failed, or no scan result came back.")
    message: str = Field(default="", description="Why there are no rows, or a summary of the differences.")


# --------------------------------------------------------------------------- pure: pins, versions, verdicts


def components(project: Project) -> tuple[str, ...]:
    return COMPONENTS + (("megatron",) if project.image is not None and project.image.megatron else ())


def pins_for(project: Project, container: bool = True) -> dict[str, str]:
    """Scan check -> pinned version (absent: not pinned). The ``image:`` pins apply to the built image and, with
    ``--no-container``, to the host; not to another image named by ``cluster.container_image``."""
    if project.image is None:
        return {}
    if container and project.cluster.container_image:
        from clustertrain.image.paths import sqsh_path

        if project.cluster.container_image != str(sqsh_path(project)):
            return {}
    table = resolved(load_versions(project.image.versions), project.image.megatron)
    out = {}
    for name in components(project):
        entry = table.get(PIN_KEYS.get(name, name))
        if entry and entry.get("version"):
            out[name] = str(entry["version"])
    return out


def found_version(c: CheckResult) -> str | None:
    """The comparable version of a scan result: its ``version``; for a scan written before that field, the
    first word of ``found`` that starts with a digit (``13.0 (nvcc)``, ``torch 2.5.1``)."""
    if c.version:
        return c.version
    if "version" in c.model_fields_set or c.found == "not found":
        return None
    return next((w for w in c.found.split() if w[:1].isdigit()), None)


def matches_pin(pin: str, found: str) -> bool:
    """``found`` equals ``pin`` on the pin's own precision: 13.1 ~ 13.1.1, 1.22.0 ~ 1.22.0-aws,
    core_v0.16.1 ~ 0.16.1; 13.1.1 is not matched by 13.1."""
    p, f = vtuple(pin), vtuple(found)
    return bool(p) and f[:len(p)] == p


def compare(component: str, pin: str | None, c: CheckResult | None) -> ImageCheckRow:
    """One row: the scan's result for ``component`` against its pin (module docstring's table)."""
    pinned = pin or NOT_PINNED
    if c is None:
        return ImageCheckRow(component=component, pinned=pinned, found="not scanned", status="not scanned", verdict="warn",
                             detail=f"the scan has no {component} check (requirements.yaml roles.container)")
    version = found_version(c)
    row = dict(component=component, pinned=pinned, found=c.found, version=version, status=c.status)
    if c.status == "fail":
        return ImageCheckRow(**row, verdict="fail", detail=f"scan: {c.required} required; {c.detail}".strip("; "))
    if pin is None or c.status == "not-applicable":
        return ImageCheckRow(**row, verdict=c.status, detail=c.detail)
    if c.found == "not found":
        return ImageCheckRow(**row, verdict="fail", detail=f"pinned {pin}, but not in the image; {c.detail}".strip("; "))
    if version is None:
        return ImageCheckRow(**row, verdict="warn", detail=f"version unreadable: cannot compare with the pin {pin}; {c.detail}"
                             .strip("; "))
    if matches_pin(pin, version):
        return ImageCheckRow(**row, verdict=c.status, detail="" if c.status == "pass" else c.detail)
    return ImageCheckRow(**row, verdict="warn", detail=f"{version} is not the pinned {pin}; it meets the scan's {c.required}")


def pyxis_missing(text: str) -> bool:
    """Whether srun's stderr says it does not know ``--container-image`` (no Pyxis plugin)."""
    return bool(_PYXIS_RE.search(text))


PYXIS_MESSAGE = ("Pyxis is not installed or enabled on this cluster: srun does not know --container-image. With "
                 "ParallelCluster the head node script enables it (clustertrain cluster scripts); to scan the nodes' "
                 "host instead, run `clustertrain image check PROJECT --no-container`")


def transport_planned(project: Project, container: bool) -> bool:
    """Whether the job runs the NCCL init step: in the image, on a project with GPUs."""
    return container and project.cluster.gpus_per_node > 0


def efa_expected(project: Project) -> bool:
    """Whether the instance type's NCCL preset has the EFA layer (``launch/presets.yaml``)."""
    from clustertrain.launch.presets import preset_of

    return preset_of(project.cluster.instance_type)[1]


def transport_rows_of(project: Project, nccl_log: str) -> list[ImageCheckRow]:
    """The NCCL init's rows (:func:`clustertrain.validate.transport.one_rank_rows`) as image-check rows."""
    return [ImageCheckRow(component=r.check, pinned=r.threshold, found=r.found, status=r.verdict, verdict=r.verdict,
                          detail=r.detail)
            for r in one_rank_rows(nccl_log, efa_expected=efa_expected(project),
                                   instance_type=project.cluster.instance_type, job=NAME)]


def judge(project: Project, scan: ScanReport | None, *, container: bool, errors: str = "",
          missing: str = "", nccl_log: str | None = None) -> tuple[list[ImageCheckRow], bool, str]:
    """Rows, failed, message. ``scan`` None: ``errors`` (the step's and the job's stderr) says why, else
    ``missing`` (the job's state and last lines) does. ``nccl_log``: the NCCL init's stdout and stderr ("" when
    it left none); None when the job had no such step."""
    if scan is None:
        if container and pyxis_missing(errors):
            return [], True, PYXIS_MESSAGE
        return [], True, f"no scan result: {missing or 'the step wrote nothing'}"
    pins = pins_for(project, container)
    by_name = {c.name: c for c in scan.checks}
    rows = [compare(name, pins.get(name), by_name.get(name)) for name in components(project)]
    failed = any(r.verdict == "fail" for r in rows)
    differ = [r.component for r in rows if r.verdict == "warn"]
    where = "in the image" if container else "on the host"
    message = (f"{sum(r.verdict == 'fail' for r in rows)} component(s) missing or below the minimum {where}"
               if failed else f"{', '.join(differ)}: not as pinned (see the rows)" if differ else
               f"the pinned versions, {where}" if pins else f"the scan passes {where} (nothing pinned)")
    if nccl_log is not None:
        net = transport_rows_of(project, nccl_log)
        bad = [r for r in net if r.verdict == "fail"]
        if bad:
            said = "; ".join(f"{r.component}: {r.found}" for r in bad)
            message = f"NCCL in the image: {said} ({bad[0].detail})" + (f"; {message}" if failed else "")
            failed = True
        rows += net
    return rows, failed, message


def check_table(report: ImageCheckReport) -> str:
    """A plain table (component, pinned, found, verdict), the reason of each row not passed, and a verdict line."""
    where = f"image {report.image}" if report.container else "the node's host (--no-container)"
    out = [f"# image check {report.project}: {where}; node {report.node or '?'}, Slurm job {report.job_id or '-'} "
           f"{report.state.value}"] + ([f"{'component':<14} {'pinned':<14} {'found':<44} verdict"] if report.rows else [])
    for r in report.rows:
        out.append(f"{r.component:<14} {r.pinned[:14]:<14} {r.found[:44]:<44} {r.verdict}")
        if r.detail and r.verdict not in ("pass", "not-applicable"):
            out.append(f"{'':<14} ({r.detail[:160]})")
    out.append(f"verdict: {'FAILED' if report.failed else 'OK'}" + (f": {report.message}" if report.message else "")
               + f"; report: {Path(report.directory) / 'image-check.json'}")
    return "\n".join(out)


# --------------------------------------------------------------------------- the job


def image_to_check(project: Project, container: bool) -> str | None:
    """The image the job runs in (None with ``container`` False); refuse in one line when there is none, or when
    it is a file that is not there (the launch preflight's own rule)."""
    if not container:
        return None
    image = project.container_image
    if image is None:
        raise ImageError(f"project {project.name!r} has no image to check: add an image: section and run `clustertrain "
                         "image build PROJECT`, or set cluster.container_image; to scan the nodes' host, use --no-container")
    from clustertrain.launch.preflight import image_findings

    for f in image_findings(project):
        if f.level == "error":
            raise ImageError(f"{f.path}: {f.message}; fix: {f.fix}")
    return image


def plan_check(project: Project, paths: SuitePaths, *, container: bool, timeout_s: float):
    """The one job (a :class:`~clustertrain.validate.suitejob.SuiteJob`) that scans the image, or the host."""
    from clustertrain.image.paths import image_interpreter
    from clustertrain.validate.suite import suite_context
    from clustertrain.validate.suitejob import SuiteConfig, new_job, srun_step

    image = image_to_check(project, container)
    python = (image_interpreter(project) or "python") if container else (project.launch.python or sys.executable)
    ctx = suite_context(project, SuiteConfig(nodes=1, job_timeout_s=timeout_s, start_timeout_s=timeout_s, python=python), paths)
    res = paths.results(NAME)
    pyxis: tuple[str, ...] = ()
    if image is not None:
        mount = () if set(",:") & set(str(res)) else (f"--container-mounts={res}:{res}",)
        pyxis = (f"--container-image={image}", "--no-container-mount-home", *mount)
    itype = project.cluster.instance_type
    scan = [python, "-m", "clustertrain", "validate", "scan", "--role", "container", "--json",
            *(["--instance-type", itype] if itype else [])]
    steps, outputs, extra = [srun_step(ctx, 1, None, res, "scan.json", pyxis) + scan], [res / "scan.json"], {}
    if transport_planned(project, container):
        from clustertrain.launch.presets import rank_environment

        steps.append(srun_step(ctx, 1, None, res, NCCL_LOG, pyxis) + ["env", *PROBE_ENV, python, "-c", PROBE])
        outputs.append(res / NCCL_LOG)
        extra["env"] = rank_environment(itype, 1, project.launch, os=project.aws.os if project.aws else None, container=True)
    job = new_job(ctx, NAME, NAME, nodes=1, ntasks_per_node=1, steps=steps, outputs=outputs, **extra)
    return replace(job, job_name=f"{project.name}-{NAME}", submit_command="clustertrain image check PROJECT"
                   + ("" if container else " --no-container"))


def run_image_check(project: Project, *, container: bool = True, timeout_s: float = 900.0,
                    env: Mapping[str, str] | None = None, poll_s: float = 0.5) -> ImageCheckReport:
    """Submit the job, wait (cancelled past ``timeout_s`` from submission, or on Ctrl-C), judge, write
    ``image-check.json``. ``env``: Slurm client variables over this process's environment."""
    from clustertrain.launch.batch import batch_state, cancel_job, submit_script
    from clustertrain.launch.slurmcli import require_slurm
    from clustertrain.validate.suite import new_suite_dir
    from clustertrain.validate.suitejob import render_job, why_missing

    image = image_to_check(project, container)  # refuse before making a directory
    require_slurm(env)  # no controller: one line, before the directory too
    paths = new_suite_dir(project)
    report = ImageCheckReport(project=project.name, image=image, container=container, directory=str(paths.root),
                              started=datetime.now().isoformat(timespec="seconds"))
    job = plan_check(project, paths, container=container, timeout_s=timeout_s)
    paths.jobs.mkdir()
    paths.logs.mkdir()  # Slurm does not make the output directory
    job.results_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(paths.script(NAME), render_job(job, paths))
    job_id = submit_script(paths.script(NAME), env, cwd=paths.root)
    report.job_id = job_id
    t_submit = time.monotonic()
    try:
        while True:
            status = batch_state(job_id, env)
            if status.state.finished:
                state, slurm_state, exit_code = status.state, status.slurm_state or None, status.exit_code
                break
            if time.monotonic() - t_submit > timeout_s:
                cancel_job(job_id, env)
                state = State.TIMEOUT if status.state == State.RUNNING else State.NOT_STARTED
                slurm_state, exit_code = None, None
                break
            time.sleep(poll_s)
    except BaseException:  # never leave the job behind on an error or Ctrl-C
        try:
            cancel_job(job_id, env)
        except LaunchError:
            pass
        raise
    outcome = JobOutcome(name=NAME, job_id=job_id, state=state, slurm_state=slurm_state, exit_code=exit_code,
                         script=str(paths.script(NAME)), output=str(paths.output(job.job_name, job_id)),
                         elapsed_s=round(time.monotonic() - t_submit, 2))
    report.state, report.node = state, (status.nodes[0] if status.nodes else None)
    scan = load_result(ScanReport, job.results_dir / "scan.json")
    errors = "\n".join(read_text(p) or "" for p in (job.results_dir / "scan.json.err", Path(outcome.output or "/-")))
    missing = why_missing(job, outcome)
    if state in (State.TIMEOUT, State.NOT_STARTED) and scan is None:
        missing = (f"job still {'running' if state == State.TIMEOUT else 'pending'} after {timeout_s:g}s; cancelled "
                   f"(Slurm job {job_id})")
    nccl_log = None
    if transport_planned(project, container):
        nccl_log = "\n".join(read_text(job.results_dir / name) or "" for name in (NCCL_LOG, NCCL_LOG + ".err"))
    report.rows, report.failed, report.message = judge(project, scan, container=container, errors=errors, missing=missing,
                                                       nccl_log=nccl_log)
    write_atomic(paths.root / "image-check.json", report.model_dump_json(indent=2) + "\n")
    return report
