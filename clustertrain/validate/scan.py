"""Environment scans: ``scan(role)`` for ``head``, ``compute`` or ``container``.

Each check reads the real source through :mod:`clustertrain.validate.probes` and is compared with
the requirements table ``requirements.yaml`` (DATA, model :class:`RequirementsConfig`): per role,
which checks apply and at which level (``required`` -> fail, ``recommended`` -> warn, ``absent`` ->
not needed), per instance family or type the GPU and EFA counts, and the minimum versions — the base
ones raised per instance family/type (:func:`~clustertrain.validate.requirements.minimums_for`; a
version below the minimum names where the minimum comes from).
A result is ``pass`` / ``warn`` / ``fail`` / ``not-applicable`` with what was found and what is
required; a missing tool is "not found", never an exception.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Literal

from pydantic import Field

import clustertrain.validate.probes as probes  # the module, not the package: no import circle with __init__
from clustertrain.core.schema import StoredModel
from clustertrain.validate.probes import Finding, version_at_least
from clustertrain.validate.requirements import (  # noqa: F401  (re-exported: the table's format lives there)
    DEFAULT_REQUIREMENTS, FamilyConfig, Level, Minimum, MinimumsConfig, RequirementsConfig, Role, family_entry,
    load_requirements, minimums_for,
)
from clustertrain.validate.results import ValidateError

Status = Literal["pass", "warn", "fail", "not-applicable"]
ROLES = ("head", "compute", "container")


class CheckResult(StoredModel):
    name: str = Field(description="Check name (gpu, cuda_driver, efa, ...).")
    status: Status = Field(description="pass / warn / fail / not-applicable.")
    found: str = Field(description="What the source said, or 'not found'.")
    required: str = Field(description="What the table requires.")
    detail: str = Field(default="", description="Where it was read and why the status.")
    version: str | None = Field(default=None, description="The comparable version read (2.29.7, 1.22.0-aws...), None when "
                                                          "none was read (absent, unreadable, not a versioned check).")


class ScanReport(StoredModel):
    role: Role = Field(description="Node role scanned.")
    instance_type: str | None = Field(description="Instance type (from DMI or the caller), None if unknown.")
    family: str = Field(description="Requirements family used.")
    checks: list[CheckResult] = Field(description="One result per check, in table order.")
    failed: bool = Field(description="True when any check failed.")


def _status(level: Level, ok: bool | None) -> Status:
    """ok True -> pass; False (missing/too old) -> by level; None (found, version unreadable) -> warn."""
    if ok:
        return "pass"
    if level == "absent":
        return "not-applicable"
    if ok is None:
        return "warn"
    return "fail" if level == "required" else "warn"


def _versioned(name: str, level: Level, f: Finding, minimum: Minimum) -> CheckResult:
    req = f">= {minimum.version}"
    if f.found is None:
        return CheckResult(name=name, status=_status(level, False), found="not found", required=req, detail=f.detail)
    ok = version_at_least(f.version, minimum.version)
    detail = f.detail + ("" if ok is not None else "; version unreadable")
    if ok is False:
        detail += f"; minimum from {minimum.source}"
    return CheckResult(name=name, status=_status(level, ok), found=f.found, required=req, detail=detail.strip("; "),
                       version=f.version)


def _present(name: str, level: Level, f: Finding, required: str = "installed") -> CheckResult:
    found = f.found if f.found is not None else "not found"
    ok = f.found is not None and not found.startswith("installed, version unreadable")
    st = _status(level, ok if f.found is None or ok else None)
    return CheckResult(name=name, status=st, found=found, required=required, detail=f.detail, version=f.version)


def scan(role: str, instance_type: str | None = None, requirements: RequirementsConfig | None = None) -> ScanReport:
    """Run every check the table lists for ``role`` on this machine."""
    if role not in ROLES:
        raise ValidateError(f"role {role!r} is unknown; valid roles are: {', '.join(ROLES)}")
    req = requirements or load_requirements()
    itype = instance_type or probes.probe_instance_type()
    family, fam = family_entry(req, itype)
    mins = minimums_for(req, itype)
    cache: dict[str, Finding] = {}

    def once(key: str, fn: Callable[[], Finding]) -> Finding:
        if key not in cache:
            try:
                cache[key] = fn()
            except Exception as e:  # a probe bug must not abort the scan; report it
                cache[key] = Finding(found=None, detail=f"probe error: {type(e).__name__}: {e}")
        return cache[key]

    def gpu(level: Level) -> CheckResult:
        f = once("gpu", probes.probe_gpus)
        req_s = "no GPU needed" if level == "absent" else f">= {fam.gpus} GPU(s)"
        if f.found is None:
            return CheckResult(name="gpu", status=_status(level, False), found="not found", required=req_s,
                               detail=f.detail + ("; expected on a head node" if level == "absent" else ""))
        ok = (f.count or 0) >= fam.gpus or level == "absent"
        detail = f.detail
        if ok and fam.gpu_name and not any(fam.gpu_name in (n or "") for n in f.extra.get("names", [])):
            detail, ok = f"{detail}; GPU is not a {fam.gpu_name} as {family} has".strip("; "), None
        return CheckResult(name="gpu", status=_status(level, ok), found=f.found, required=req_s, detail=detail)

    def efa(level: Level) -> CheckResult:
        f = once("efa", probes.probe_efa)
        need = fam.efa_devices if level == "required" else 1
        req_s = f">= {need} EFA device(s)"
        ok = f.found is not None and (f.count or 0) >= need
        found = f.found or "not found"
        return CheckResult(name="efa", status=_status(level, ok if f.found is None or ok else False), found=found,
                           required=req_s, detail=f.detail)

    checks: dict[str, Callable[[Level], CheckResult]] = {
        "gpu": gpu,
        "cuda_driver": lambda lv: _versioned("cuda_driver", lv, once("gpu", probes.probe_gpus), mins["cuda_driver"]),
        "efa": efa,
        "efa_installer": lambda lv: _versioned("efa_installer", lv, once("efai", probes.probe_efa_installer),
                                               mins["efa_installer"]),
        "libfabric": lambda lv: _present("libfabric", lv, once("lf", probes.probe_libfabric)),
        "enroot": lambda lv: _present("enroot", lv, once("enroot", lambda: probes.probe_command_version(
            [["enroot", "version"]]))),
        "docker": lambda lv: _present("docker", lv, once("docker", lambda: probes.probe_command_version(
            [["docker", "--version"]]))),
        "slurm": lambda lv: _present("slurm", lv, once("slurm", lambda: probes.probe_command_version(
            [["sinfo", "-V"], ["slurmctld", "-V"], ["slurmd", "-V"]]))),
        "scratch": lambda lv: _present("scratch", lv, once("scratch", lambda: probes.probe_mounts(req.scratch_mounts)),
                                       "node-local scratch mounted"),
        "shared_fs": lambda lv: _present("shared_fs", lv, once("shared", lambda: probes.probe_mounts(req.shared_mounts)),
                                         "shared file system (FSx) mounted"),
        "cuda": lambda lv: _versioned("cuda", lv, once("cuda", probes.probe_cuda_toolkit), mins["cuda"]),
        "nccl": lambda lv: _versioned("nccl", lv, once("nccl", probes.probe_nccl), mins["nccl"]),
        "aws_ofi_nccl": lambda lv: _versioned("aws_ofi_nccl", lv, once("ofi", lambda: probes.probe_aws_ofi_nccl(
            os.environ.get("LD_LIBRARY_PATH", ""))), mins["aws_ofi_nccl"]),
        "torch": lambda lv: _versioned("torch", lv, once("torch", lambda: probes.probe_python_package(["torch"], "torch")),
                                       mins["torch"]),
        "megatron": lambda lv: _present("megatron", lv, once("megatron", lambda: probes.probe_python_package(
            ["megatron-core", "megatron-lm"], "megatron"))),
    }
    results = []
    for name, level in req.roles.get(role, {}).items():  # type: ignore[call-overload]
        if name not in checks:
            raise ValidateError(f"requirements table: roles.{role}.{name} is not a known check; "
                                f"valid checks are: {', '.join(checks)}")
        results.append(checks[name](level))
    return ScanReport(role=role, instance_type=itype, family=family, checks=results,  # type: ignore[arg-type]
                      failed=any(c.status == "fail" for c in results))


def scan_table(report: ScanReport) -> str:
    out = [f"# scan role={report.role} instance={report.instance_type or 'unknown'} family={report.family}",
           f"{'check':<14} {'status':<15} {'found':<45} required"]
    for c in report.checks:
        out.append(f"{c.name:<14} {c.status:<15} {c.found[:45]:<45} {c.required}")
        if c.detail and c.status != "pass":
            out.append(f"{'':<14} {'':<15} ({c.detail[:150]})")
    out.append(f"verdict: {'FAILED' if report.failed else 'OK'}")
    return "\n".join(out)
