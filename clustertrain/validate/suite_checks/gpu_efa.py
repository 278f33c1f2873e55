"""Check ``gpu-efa``: the host scan — what only the bare node shows: GPUs, EFA devices, NVLink links, kernel
modules, the EFA installer and Enroot.

One task per node, on the host (no container: these are the node's own driver, devices and modules; the image's
software is the smoke job's scan), with the node's own tools only (the compute AMI has no Python clustertrain):
``nvidia-smi --query-gpu=... --format=csv`` into ``nvidia-smi-<i>.csv``, ``fi_info -p efa -t FI_EP_RDM`` into
``fi_info-<i>.txt``, ``nvidia-smi nvlink -s`` into ``nvlink-<i>.txt``, and :data:`HOST_SCRIPT` into
``host-<i>.txt``: one line per kernel module (``module nvidia|efa|gdrdrv VERSION|loaded|absent``, from
``/sys/module``), ``efa_installer VERSION|absent`` (``/opt/amazon/efa_installed_packages``), ``enroot
VERSION|absent``.

Judged per node: GPUs >= ``cluster.gpus_per_node``, EFA devices >= the instance family's count (requirements.yaml),
no inactive NVLink link; ``modules``: ``nvidia`` loaded at >= the driver minimum and ``efa`` loaded where the
type has EFA (fail), ``gdrdrv`` (GDRCopy's kernel module, which the image's GDRCopy library needs; warn);
``efa_installer`` >= its minimum; ``enroot`` present when the project runs in a container image. Not applicable
(no job) when ``cluster.gpus_per_node`` is 0.
"""

from __future__ import annotations

import re

from clustertrain.project import Project
from clustertrain.validate.check_rows import CheckRow
from clustertrain.validate.probes import parse_fi_info, parse_nvidia_smi_csv, version_at_least
from clustertrain.validate.requirements import family_entry, load_requirements, minimums_for
from clustertrain.validate.suitedir import JobOutcome, read_text
from clustertrain.validate.suitejob import SuiteContext, SuiteJob, new_job, srun_step

NAME = "gpu-efa"
QUERY = "--query-gpu=index,name,driver_version,memory.total,pci.bus_id"
#: what only the host shows, with the shell alone (see the module docstring for the lines it prints)
HOST_SCRIPT = ('for m in nvidia efa gdrdrv; do if [ -d "/sys/module/$m" ]; then '
               'echo "module $m $(cat "/sys/module/$m/version" 2>/dev/null || echo loaded)"; '
               'else echo "module $m absent"; fi; done; '
               'v=$(sed -n "s/^EFA installer version: *//p" /opt/amazon/efa_installed_packages 2>/dev/null | head -n 1); '
               'echo "efa_installer ${v:-absent}"; '
               'if command -v enroot >/dev/null 2>&1; then echo "enroot $(enroot version 2>&1 | head -n 1)"; '
               'else echo "enroot absent"; fi')
#: result file stem and extension -> the command that writes it
TOOLS = {("nvidia-smi", "csv"): ["nvidia-smi", QUERY, "--format=csv"],
         ("fi_info", "txt"): ["fi_info", "-p", "efa", "-t", "FI_EP_RDM"],
         ("nvlink", "txt"): ["nvidia-smi", "nvlink", "-s"], ("host", "txt"): ["bash", "-c", HOST_SCRIPT]}


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
    return evaluate_gpu_efa(ctx.project, names, texts["nvidia-smi"], texts["fi_info"], texts["nvlink"], texts["host"])


def parse_host(text: str | None) -> dict[str, str]:
    """:data:`HOST_SCRIPT`'s lines: ``{"module nvidia": "580.65.06", "efa_installer": "1.43.1", "enroot": ...}``."""
    out: dict[str, str] = {}
    for line in (text or "").splitlines():
        words = line.split()
        if len(words) >= 3 and words[0] == "module":
            out[f"module {words[1]}"] = words[2]
        elif len(words) >= 2 and words[0] in ("efa_installer", "enroot"):
            out[words[0]] = " ".join(words[1:])
    return out


def host_rows(project: Project, node: str, text: str | None, efa_expected: bool) -> list[CheckRow]:
    """The ``modules``, ``efa_installer`` and ``enroot`` rows of one node (see the module docstring)."""
    got = parse_host(text)
    mins = minimums_for(load_requirements(), project.cluster.instance_type)
    if not got:
        return [CheckRow(job=NAME, check=f"host {node}", verdict="fail", found="no host scan",
                         threshold="kernel modules, EFA installer, Enroot read", detail="host-<i>.txt is empty or missing")]
    mods = {m: got.get(f"module {m}", "absent") for m in ("nvidia", "efa", "gdrdrv")}
    problems = []
    driver = mins["cuda_driver"]
    if mods["nvidia"] == "absent":
        problems.append("nvidia module not loaded")
    elif version_at_least(mods["nvidia"], driver.version) is False:
        problems.append(f"driver {mods['nvidia']} < {driver.version} ({driver.source})")
    if efa_expected and mods["efa"] == "absent":
        problems.append("efa module not loaded")
    verdict = "fail" if problems else "warn" if mods["gdrdrv"] == "absent" else "pass"
    detail = "; ".join(problems) or ("gdrdrv (GDRCopy) not loaded: NCCL and libfabric run without GDRCopy"
                                     if verdict == "warn" else "/sys/module")
    rows = [CheckRow(job=NAME, check=f"modules {node}", verdict=verdict,
                     found=", ".join(f"{m} {v}" for m, v in mods.items()),
                     threshold=f"nvidia >= {driver.version}" + (", efa" if efa_expected else "") + "; gdrdrv recommended",
                     detail=detail)]
    inst, need = got.get("efa_installer", "absent"), mins["efa_installer"]
    ok = inst != "absent" and version_at_least(inst, need.version) is not False
    rows.append(CheckRow(job=NAME, check=f"efa_installer {node}",
                         verdict="pass" if ok else "fail" if efa_expected else "not-applicable", found=inst,
                         threshold=f">= {need.version}", detail="/opt/amazon/efa_installed_packages"
                         + ("" if ok or inst == "absent" else f"; minimum from {need.source}")))
    enroot = got.get("enroot", "absent")
    rows.append(CheckRow(job=NAME, check=f"enroot {node}", verdict="pass" if enroot != "absent" else
                         "fail" if project.container_image else "not-applicable", found=enroot,
                         threshold="installed (Pyxis runs the image with it)" if project.container_image else "not needed"))
    return rows


def evaluate_gpu_efa(project: Project, nodes: list[str], smi: list[str | None], fi: list[str | None],
                     nvlink: list[str | None], host: list[str | None] | None = None) -> list[CheckRow]:
    """GPU count (cluster.gpus_per_node), EFA devices (requirements.yaml family), NVLink links up; with ``host``
    (each node's :data:`HOST_SCRIPT` output), its kernel modules, EFA installer and Enroot (:func:`host_rows`)."""
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
        if host is not None:
            rows += host_rows(project, node, host[i] if i < len(host) else None, fam.efa_devices > 0)
    return rows
