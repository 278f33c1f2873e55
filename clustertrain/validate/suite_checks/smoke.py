"""Check ``smoke``: every node answers and passes the compute-node scan.

One task per node: ``echo "$SLURMD_NODENAME $(hostname)"`` into ``host-<i>.txt`` and ``clustertrain validate
scan --role compute --json`` into ``scan-<i>.json``. Judged: every node answered with a scan; each scan check,
worst over the nodes. Checks that do not apply to the project are not-applicable: GPU/EFA checks when
``cluster.gpus_per_node`` is 0, enroot without a container image, the FSx mount check without
``aws.fsx``.
"""

from __future__ import annotations

from clustertrain.project import Project
from clustertrain.validate.check_rows import CheckRow, worst
from clustertrain.validate.scan import ScanReport
from clustertrain.validate.suitedir import JobOutcome, load_result, read_text
from clustertrain.validate.suitejob import SuiteContext, SuiteJob, new_job, srun_step, why_missing

NAME = "smoke"
GPU_EFA_CHECKS = ("gpu", "cuda_driver", "efa", "efa_installer", "libfabric", "aws_ofi_nccl", "nccl", "cuda")


def not_applicable(ctx: SuiteContext) -> str | None:
    return None


def plan(ctx: SuiteContext) -> list[SuiteJob]:
    n, res, itype = ctx.cfg.nodes, ctx.paths.results(NAME), ctx.project.cluster.instance_type
    scan = [ctx.cfg.python, "-m", "clustertrain", "validate", "scan", "--role", "compute", "--json",
            *(["--instance-type", itype] if itype else [])]
    return [new_job(ctx, NAME, NAME, nodes=n, ntasks_per_node=1, steps=[
        srun_step(ctx, n, 1, res, "host-%n.txt") + ["bash", "-c", 'echo "$SLURMD_NODENAME $(hostname)"'],
        srun_step(ctx, n, 1, res, "scan-%n.json") + scan],
        outputs=[res / f"{kind}-{i}.{ext}" for i in range(n) for kind, ext in (("host", "txt"), ("scan", "json"))])]


def gather(job: SuiteJob, outcome: JobOutcome, nodes: list[str], ctx: SuiteContext) -> list[CheckRow]:
    hosts = [(read_text(job.results_dir / f"host-{i}.txt") or "").strip() or None for i in range(job.nodes)]
    scans = [load_result(ScanReport, job.results_dir / f"scan-{i}.json") for i in range(job.nodes)]
    names = [h.split()[0] if h else (nodes[i] if i < len(nodes) else str(i)) for i, h in enumerate(hosts)]
    rows = evaluate_smoke(ctx.project, names, hosts, scans)
    if not all(scans):
        rows[0].detail = (rows[0].detail + "; " + why_missing(job, outcome)).strip("; ")
    return rows


def evaluate_smoke(project: Project, nodes: list[str], hosts: list[str | None],
                   scans: list[ScanReport | None]) -> list[CheckRow]:
    """One row for the nodes that answered, then one per scan check (worst over nodes)."""
    answered = [f"{h}" for h in hosts if h]
    rows = [CheckRow(job=NAME, check="nodes", verdict="pass" if len(answered) == len(hosts) and
                     all(scans) else "fail", found=f"{len(answered)}/{len(hosts)}: {', '.join(answered)}",
                     threshold=f"{len(hosts)} node(s) answer with a scan", detail=" ".join(
                         f"{nodes[i] if i < len(nodes) else i}: no scan result" for i, s in enumerate(scans) if s is None))]
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


def _not_applicable(project: Project, check: str) -> str | None:
    cl = project.cluster
    if check in GPU_EFA_CHECKS and cl.gpus_per_node == 0:
        return "not applicable: gpus_per_node=0"
    if check == "enroot" and not project.container_image:
        return "not applicable: no container image (cluster.container_image, image:)"
    if check == "shared_fs" and not (project.aws and project.aws.fsx):
        return "not applicable: no aws.fsx; storage.root is benchmarked by the storage job"
    return None
