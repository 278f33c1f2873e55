"""Check ``smoke``: every node answers, runs the jobs' interpreter, and passes the scan of what training runs on.

One task per node, three steps: ``echo "$SLURMD_NODENAME $(hostname)"`` on the bare node into ``host-<i>.txt``
(the node answers even where its container cannot start); the interpreter (:data:`INTERPRETER`: its path, Python
version and the clustertrain version it imports) into ``python-<i>.txt``; ``clustertrain validate scan --json``
into ``scan-<i>.json``. With a container image the last two run in the image through Pyxis
(:func:`~clustertrain.validate.suitejob.in_image`, training's options and environment) with the image's
interpreter, and the scan's role is ``container`` (CUDA, NCCL, aws-ofi-nccl, libfabric, torch in the image);
what only the host shows (driver, EFA devices, kernel modules, Enroot) is the ``gpu-efa`` job's host scan.
Without an image (a CPU project) both run on the host with ``--role compute``.

Judged: every node answered with a scan; the ``interpreter`` row: every node ran it and imports this
clustertrain version (another version: warn; nothing printed: fail, with the step's last stderr line); each scan
check, worst over the nodes. Checks that do not apply are not-applicable: GPU/EFA checks when
``cluster.gpus_per_node`` is 0, enroot without a container image, the FSx mount check without ``aws.fsx``.
"""

from __future__ import annotations

from clustertrain import __version__
from clustertrain.launch.presets import RankEnvironment
from clustertrain.project import Project
from clustertrain.validate.check_rows import CheckRow, worst
from clustertrain.validate.scan import ScanReport
from clustertrain.validate.suitedir import JobOutcome, load_result, read_text
from clustertrain.validate.suitejob import SuiteContext, SuiteJob, in_image, job_env, new_job, srun_step, why_missing

NAME = "smoke"
GPU_EFA_CHECKS = ("gpu", "cuda_driver", "efa", "efa_installer", "libfabric", "aws_ofi_nccl", "nccl", "cuda")
#: the interpreter step: prints ``<sys.executable> <Python version> <clustertrain version>``
INTERPRETER = "import sys, clustertrain; print(sys.executable, sys.version.split()[0], clustertrain.__version__)"


def not_applicable(ctx: SuiteContext) -> str | None:
    return None


def plan(ctx: SuiteContext) -> list[SuiteJob]:
    n, res, itype = ctx.cfg.nodes, ctx.paths.results(NAME), ctx.project.cluster.instance_type
    image = ctx.project.container_image
    env = job_env(ctx, n) if image else RankEnvironment()
    box, env = in_image(ctx, env, res)
    python = str(ctx.cfg.python)
    scan = [python, "-m", "clustertrain", "validate", "scan", "--role", "container" if image else "compute", "--json",
            *(["--instance-type", itype] if itype else [])]
    return [new_job(ctx, NAME, NAME, nodes=n, ntasks_per_node=1, env=env, steps=[
        srun_step(ctx, n, 1, res, "host-%n.txt") + ["bash", "-c", 'echo "$SLURMD_NODENAME $(hostname)"'],
        srun_step(ctx, n, 1, res, "python-%n.txt", box.srun) + box.command([python, "-c", INTERPRETER]),
        srun_step(ctx, n, 1, res, "scan-%n.json", box.srun) + box.command(scan)],
        outputs=[res / f"{kind}-{i}.{ext}" for i in range(n) for kind, ext in
                 (("host", "txt"), ("python", "txt"), ("scan", "json"))])]


def gather(job: SuiteJob, outcome: JobOutcome, nodes: list[str], ctx: SuiteContext) -> list[CheckRow]:
    hosts = [(read_text(job.results_dir / f"host-{i}.txt") or "").strip() or None for i in range(job.nodes)]
    scans = [load_result(ScanReport, job.results_dir / f"scan-{i}.json") for i in range(job.nodes)]
    names = [h.split()[0] if h else (nodes[i] if i < len(nodes) else str(i)) for i, h in enumerate(hosts)]
    pythons = [(read_text(job.results_dir / f"python-{i}.txt") or "").strip() or
               _last_line(read_text(job.results_dir / f"python-{i}.txt.err")) for i in range(job.nodes)]
    rows = evaluate_smoke(ctx.project, names, hosts, scans, pythons, python=str(ctx.cfg.python))
    if not all(scans):
        rows[0].detail = (rows[0].detail + "; " + why_missing(job, outcome)).strip("; ")
    return rows


def _last_line(text: str | None) -> str | None:
    """``!`` and the last non-blank line of a step's stderr (what srun or Pyxis said), None without one."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return "! " + lines[-1][:200] if lines else None


def evaluate_smoke(project: Project, nodes: list[str], hosts: list[str | None],
                   scans: list[ScanReport | None], pythons: list[str | None] | None = None,
                   python: str = "") -> list[CheckRow]:
    """One row for the nodes that answered, the ``interpreter`` row (with ``pythons``: what each node's interpreter
    step printed, or ``! <its last stderr line>``), then one per scan check (worst over nodes)."""
    answered = [f"{h}" for h in hosts if h]
    rows = [CheckRow(job=NAME, check="nodes", verdict="pass" if len(answered) == len(hosts) and
                     all(scans) else "fail", found=f"{len(answered)}/{len(hosts)}: {', '.join(answered)}",
                     threshold=f"{len(hosts)} node(s) answer with a scan", detail=" ".join(
                         f"{nodes[i] if i < len(nodes) else i}: no scan result" for i, s in enumerate(scans) if s is None))]
    if pythons is not None:
        rows.append(interpreter_row(project, nodes, pythons, python))
    names = list(dict.fromkeys(c.name for s in scans if s for c in s.checks))
    for name in names:
        per = [(nodes[i] if i < len(nodes) else str(i), c) for i, s in enumerate(scans) if s
               for c in s.checks if c.name == name]
        na = _not_applicable(project, name)
        if na:
            rows.append(CheckRow(job=NAME, check=name, verdict="not-applicable", found=per[0][1].found,
                                 threshold=per[0][1].required, detail=na))
            continue
        verdict = worst([c.status for _, c in per])
        founds = {c.found for _, c in per}
        found = per[0][1].found if len(founds) == 1 else "; ".join(f"{n}: {c.found}" for n, c in per)
        detail = "; ".join(f"{n}: {c.detail}" for n, c in per if c.status != "pass" and c.detail)
        rows.append(CheckRow(job=NAME, check=name, verdict=verdict, found=found, threshold=per[0][1].required,
                             detail=detail[:300]))
    return rows


def interpreter_row(project: Project, nodes: list[str], pythons: list[str | None], python: str) -> CheckRow:
    """Every node runs ``python`` (in the image when there is one) and it imports this clustertrain version."""
    where = f"in image {project.container_image}" if project.container_image else "on the hosts"
    threshold = f"{python} runs {where} and imports clustertrain {__version__}"
    name = lambda i: nodes[i] if i < len(nodes) else str(i)  # noqa: E731
    bad = [(name(i), p) for i, p in enumerate(pythons) if not p or p.startswith("!") or len(p.split()) != 3]
    if bad:
        fix = ("rebuild the image (`clustertrain image build`) or set launch.python to the interpreter inside it"
               if project.container_image else "set launch.python to an interpreter every node has (a shared venv)")
        return CheckRow(job=NAME, check="interpreter", verdict="fail", found=f"{len(bad)}/{len(pythons)} node(s) failed",
                        threshold=threshold, detail=("; ".join(f"{n}: {p or 'no output'}" for n, p in bad)[:240]
                                                     + f"; {fix}"))
    seen = sorted({p for p in pythons if p})
    versions = {p.split()[2] for p in seen}  # type: ignore[union-attr]
    found = "; ".join(f"{exe} (Python {py}), clustertrain {ct}" for exe, py, ct in (p.split() for p in seen))
    if versions != {__version__}:
        return CheckRow(job=NAME, check="interpreter", verdict="warn", found=found[:240], threshold=threshold,
                        detail=f"the nodes import clustertrain {', '.join(sorted(versions))}, this is {__version__}: "
                               "rebuild the image (`clustertrain image build`) so both run the same code")
    return CheckRow(job=NAME, check="interpreter", verdict="pass", found=found[:240], threshold=threshold)


def _not_applicable(project: Project, check: str) -> str | None:
    cl = project.cluster
    if check in GPU_EFA_CHECKS and cl.gpus_per_node == 0:
        return "not applicable: gpus_per_node=0"
    if check == "enroot" and not project.container_image:
        return "not applicable: no container image (cluster.container_image, image:)"
    if check == "shared_fs" and not (project.aws and project.aws.fsx):
        return "not applicable: no aws.fsx; storage.root is benchmarked by the storage job"
    return None
