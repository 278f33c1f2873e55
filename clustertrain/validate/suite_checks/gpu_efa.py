"""Check ``gpu-efa``: the GPUs, EFA devices and NVLink links of every node.

One task per node: ``nvidia-smi --query-gpu=... --format=csv`` into ``nvidia-smi-<i>.csv``, ``fi_info -p efa
-t FI_EP_RDM`` into ``fi_info-<i>.txt``, ``nvidia-smi nvlink -s`` into ``nvlink-<i>.txt``. Judged per node:
GPUs >= ``cluster.gpus_per_node``, EFA devices >= the instance family's count (requirements.yaml), no inactive
NVLink link. Not applicable (no job) when ``cluster.gpus_per_node`` is 0.
"""

from __future__ import annotations

import re

from clustertrain.project import Project
from clustertrain.validate.check_rows import CheckRow
from clustertrain.validate.probes import parse_fi_info, parse_nvidia_smi_csv
from clustertrain.validate.requirements import family_entry, load_requirements
from clustertrain.validate.suitedir import JobOutcome, read_text
from clustertrain.validate.suitejob import SuiteContext, SuiteJob, new_job, srun_step

NAME = "gpu-efa"
QUERY = "--query-gpu=index,name,driver_version,memory.total,pci.bus_id"
#: result file stem and extension -> the command that writes it
TOOLS = {("nvidia-smi", "csv"): ["nvidia-smi", QUERY, "--format=csv"],
         ("fi_info", "txt"): ["fi_info", "-p", "efa", "-t", "FI_EP_RDM"],
         ("nvlink", "txt"): ["nvidia-smi", "nvlink", "-s"]}


def not_applicable(ctx: SuiteContext) -> str | None:
    gpus = ctx.project.cluster.gpus_per_node
    return None if gpus else f"not applicable: gpus_per_node={gpus}"


def plan(ctx: SuiteContext) -> list[SuiteJob]:
    n, res = ctx.cfg.nodes, ctx.paths.results(NAME)
    return [new_job(ctx, NAME, NAME, nodes=n, ntasks_per_node=1,
                    steps=[srun_step(ctx, n, 1, res, f"{stem}-%n.{ext}") + argv for (stem, ext), argv in TOOLS.items()],
                    outputs=[res / f"{stem}-{i}.{ext}" for i in range(n) for stem, ext in TOOLS])]


def gather(job: SuiteJob, outcome: JobOutcome, nodes: list[str], ctx: SuiteContext) -> list[CheckRow]:
    texts = {stem: [read_text(job.results_dir / f"{stem}-{i}.{ext}") for i in range(job.nodes)] for stem, ext in TOOLS}
    names = nodes if len(nodes) == job.nodes else [str(i) for i in range(job.nodes)]
    return evaluate_gpu_efa(ctx.project, names, texts["nvidia-smi"], texts["fi_info"], texts["nvlink"])


def evaluate_gpu_efa(project: Project, nodes: list[str], smi: list[str | None], fi: list[str | None],
                     nvlink: list[str | None]) -> list[CheckRow]:
    """GPU count (cluster.gpus_per_node), EFA devices (requirements.yaml family), NVLink links up."""
    fam_name, fam = family_entry(load_requirements(), project.cluster.instance_type)
    rows = []
    for i, node in enumerate(nodes):
        gpus = parse_nvidia_smi_csv(smi[i] or "") if i < len(smi) else []
        need = project.cluster.gpus_per_node
        rows.append(CheckRow(job=NAME, check=f"gpus {node}", verdict="pass" if len(gpus) >= need else "fail",
                             found=f"{len(gpus)} x {gpus[0].get('name') if gpus else '-'}", threshold=f">= {need} GPU(s)",
                             detail="" if gpus else "nvidia-smi gave no GPU rows"))
        efa = [b for b in parse_fi_info(fi[i] or "" if i < len(fi) else "") if b.get("provider") == "efa"]
        rows.append(CheckRow(job=NAME, check=f"efa {node}", verdict="pass" if len(efa) >= fam.efa_devices else "fail",
                             found=f"{len(efa)} EFA device(s)", threshold=f">= {fam.efa_devices} ({fam_name})",
                             detail="fi_info -p efa -t FI_EP_RDM"))
        text = nvlink[i] if i < len(nvlink) else None
        up = len(re.findall(r"Link \d+: [\d.]+ GB/s", text or ""))
        down = len(re.findall(r"Link \d+: <inactive>", text or ""))
        verdict = "fail" if down else ("pass" if up else "warn")
        rows.append(CheckRow(job=NAME, check=f"nvlink {node}", verdict=verdict, found=f"{up} up, {down} inactive",
                             threshold="no inactive link", detail="nvidia-smi nvlink -s" + ("" if up or down else
                                                                                            ": no links listed")))
    return rows
