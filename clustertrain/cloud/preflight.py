"""The cloud stage's preflight for ``clustertrain check``: everything wrong with a project's ``aws:`` section.

:func:`cloud_findings` runs, with no network call and writing nothing:

1. the project-level checks (:func:`clustertrain.cloud.project_rules.project_findings`: instance
   catalog, partition, subnets, key pair, storage policy, bucket names);
2. when those find no error: the generated ParallelCluster config through aws-parallelcluster's
   schema and its pure offline validators, plus clustertrain's rules (placeholders, boot phases,
   FSx steps, reserved capacity), merged into one finding per problem;
3. paths of the generated config are translated back to the project-file field that produced
   them (``HeadNode.Networking.SubnetId`` -> ``aws.network.public_subnet_id``) where there is one;
   the rest keep their config path, prefixed ``cluster config:``.

With ``aws.example_ids: true`` (example project files only) ids from the AWS documentation are
warnings instead of errors. A project without ``aws:`` has no cloud findings.

:func:`validate_file` (``clustertrain cluster validate FILE``) takes either a ParallelCluster config
(checked by :func:`clustertrain.cloud.validate.validate_cluster_config`) or a project file (this module).
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from clustertrain.cloud.pcluster import build_cluster_config
from clustertrain.cloud.project_rules import deploy_fix, project_findings
from clustertrain.cloud.state import OUTPUT_FIELDS
from clustertrain.cloud.rules import DOC_ID_MESSAGE
from clustertrain.cloud.validate import ValidationReport, is_project, read_cluster_config, validate_cluster_config
from clustertrain.core.errors import ClusterTrainError
from clustertrain.core.findings import Finding

if TYPE_CHECKING:
    from clustertrain.project import Project

_Q = r"^Scheduling\.SlurmQueues\[(\d+)\]"
_CR = _Q + r"\.ComputeResources\[0\]"
#: generated-config path (regex) -> project-file field (``\1`` = the queue or file system index)
CONFIG_TO_PROJECT: tuple[tuple[str, str], ...] = (
    (r"^HeadNode\.Networking\.SubnetId$", "aws.network.public_subnet_id"),
    (r"^HeadNode\.Networking\.AdditionalSecurityGroups\[0\]$", "aws.network.head_security_group_id"),
    (r"^HeadNode\.Ssh\.KeyName$", "aws.head_node.key_name"),
    (r"^HeadNode\.Ssh\.AllowedIps$", "aws.network.ssh_cidr"),
    (r"^HeadNode\.InstanceType$", "aws.head_node.instance_type"),
    (_Q + r"\.Networking\.SubnetIds\[0\]$", "aws.network.private_subnet_id"),
    (_Q + r"\.Networking\.AdditionalSecurityGroups\[0\]$", "aws.network.compute_security_group_id"),
    (_Q + r"\.Networking\.PlacementGroup\.Enabled$", r"aws.queues[\1].placement_group"),
    (_Q + r"\.Name$", r"aws.queues[\1].name"),
    (_Q + r"\.CapacityType$", r"aws.queues[\1].capacity_type"),
    (_CR + r"\.MinCount$", r"aws.queues[\1].min_count"),
    (_CR + r"\.MaxCount$", r"aws.queues[\1].max_count"),
    (_CR + r"\.InstanceType$", r"aws.queues[\1].instance_type"),
    (_CR + r"\.Efa\.Enabled$", r"aws.queues[\1].efa"),
    (_CR + r"\.CapacityReservationTarget(\.CapacityReservationId)?$", r"aws.queues[\1].capacity_reservation_id"),
    (_Q + r"\.HealthChecks\.Gpu\.Enabled$", r"aws.queues[\1].gpu_health_checks"),
    (r"^Region$", "aws.region"),
    (r"^Image\.Os$", "aws.os"),
)
_FSX_FIELDS = {"FileSystemId": "file_system_id", "StorageCapacity": "capacity_gb", "PerUnitStorageThroughput": "throughput", "DeploymentType": "deployment_type"}


def project_path(config_path: str, project: "Project") -> str:
    """The project-file field behind a generated-config path, or ``cluster config: <path>``."""
    for pattern, field in CONFIG_TO_PROJECT:
        if re.match(pattern, config_path):
            return re.sub(pattern + (".*" if not pattern.endswith("$") else ""), field, config_path)
    m = re.match(r"^SharedStorage\[(\d+)\](?:\.FsxLustreSettings\.(\w+)|\.MountDir)?", config_path)
    aws = project.aws
    if m and aws is not None:
        i = int(m.group(1))
        if i < len(aws.fsx):
            return f"aws.fsx[{i}]" + (f".{_FSX_FIELDS[m.group(2)]}" if m.group(2) in _FSX_FIELDS else
                                      ".mount_dir" if config_path.endswith("MountDir") else "")
        return f"aws.ebs[{i - len(aws.fsx)}]"
    if config_path.endswith("AdditionalIamPolicies") or ".AdditionalIamPolicies[" in config_path:
        return "aws.storage_policy_arn" if aws and aws.storage_policy_arn else "aws.additional_iam_policies"
    return f"cluster config: {config_path}"


def cloud_report(project: "Project", use_schema: bool = True) -> ValidationReport:
    """The findings of :func:`cloud_findings` with whether aws-parallelcluster ran (for ``cluster validate``)."""
    aws = project.aws
    if aws is None:
        return ValidationReport()
    found = project_findings(project)
    if any(f.level == "error" for f in found):
        return ValidationReport(findings=found, schema_note="the generated cluster config was not checked: fix these first")
    try:
        config = build_cluster_config(project)
    except ClusterTrainError as err:  # a problem project_findings does not know yet: still one finding, never a raise
        return ValidationReport(findings=found + [Finding("error", "aws", str(err), "fix the named field")])
    report = validate_cluster_config(config, use_schema=use_schema)
    stack_fields = {name for name, _ in OUTPUT_FIELDS.values()}
    said = {(f.path, f.level) for f in found}
    seen: set[tuple[str, str, str]] = set()
    for f in report.findings:
        f = replace(f, path=project_path(f.path, project))
        if f.level == "error" and DOC_ID_MESSAGE in f.message and f.path in stack_fields:
            f = replace(f, fix=f"remove it from the project file and {deploy_fix(project)}")
        if aws.example_ids and f.level == "error" and DOC_ID_MESSAGE in f.message:
            f = replace(f, level="warning", message=f"{f.message} (allowed by aws.example_ids)",
                        fix=f"{f.fix}; then remove aws.example_ids")
        if ((f.path, f.level) in said and f.source == "clustertrain") or (f.level, f.path, f.message) in seen:
            continue  # the project-level check said it first, in the project's words; or head and queues say the same
        seen.add((f.level, f.path, f.message))
        found.append(f)
    report.findings = found
    return report


def cloud_findings(project: "Project", use_schema: bool = True) -> list[Finding]:
    """Every cloud finding for ``project`` (see the module docstring); [] without an ``aws:`` section. Never raises for
    a user mistake, makes no network call, writes nothing."""
    return cloud_report(project, use_schema=use_schema).findings


def validate_file(path: Path, overrides: list[str] | None = None, use_schema: bool = True) -> ValidationReport:
    """Validate a ParallelCluster YAML file, or a clustertrain project file (then exactly what
    :func:`cloud_report` finds: project fields, generated config, one finding per problem)."""
    raw = read_cluster_config(Path(path))
    if is_project(raw):
        from clustertrain.cloud.state import attach_state
        from clustertrain.project import read_project  # project.py imports cloud.config: not at import time

        project = read_project(path, overrides)
        attach_state(project)  # the resolver's cloud step: the deployed stack's outputs
        return cloud_report(project, use_schema=use_schema)
    return validate_cluster_config(raw, use_schema=use_schema)
