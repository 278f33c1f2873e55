"""Build the AWS ParallelCluster 3.x cluster configuration from a project (a plain dict, dumped as YAML).

The config is a value first: :func:`build_cluster_config` returns the dict, :func:`render_cluster_config`
the YAML text with a header naming the tool. Nothing here talks to AWS.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import yaml

from clustertrain.cloud.catalog import InstanceCatalog, load_catalog
from clustertrain.cloud.phases import COMPUTE_SCRIPT, HEAD_SCRIPT, SETUP_DIRS_SCRIPT, action  # noqa: F401 - script names re-exported
from clustertrain.cloud.project_rules import (  # noqa: F401 - re-exported: scripts.py and infra.py import them from here
    bucket_of,
    checkpoint_bucket,
    data_bucket,
    dir_owner,
    memory_based_scheduling,
    project_findings,
    queue_exclusive,
    require_aws,
    scripts_uri,
)
from clustertrain.cloud.config import AwsConfig
from clustertrain.cloud.state import deployed_fsx_id
from clustertrain.core.errors import ConfigError

if TYPE_CHECKING:
    from clustertrain.project import Project

SSM_POLICY = "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"


def check_project_aws(project: "Project", catalog: InstanceCatalog | None = None) -> AwsConfig:
    """:func:`project_findings`, raising ConfigError with the first error (``field: problem; fix``)."""
    aws = require_aws(project)
    errors = [f for f in project_findings(project, catalog) if f.level == "error"]
    if errors:
        first = errors[0]
        raise ConfigError(f"{first.path}: {first.message}; {first.fix}")
    return aws


def _policies(aws: AwsConfig, head: bool) -> list[dict[str, str]]:
    """AdditionalIamPolicies: our storage policy (instead of S3Access, whose write access is s3:*), the extra ones, SSM."""
    arns = [a for a in [aws.storage_policy_arn, *aws.additional_iam_policies] if a]
    if head and aws.head_node.ssm:
        arns.append(SSM_POLICY)
    return [{"Policy": a} for a in dict.fromkeys(arns)]


def build_cluster_config(project: "Project", catalog: InstanceCatalog | None = None) -> dict[str, Any]:
    """The ParallelCluster config as a dict (validated against the catalog; schema checks are in validate.py)."""
    cat = catalog or load_catalog()
    aws = check_project_aws(project, cat)
    net = aws.network
    uri = scripts_uri(project)
    owner, group = dir_owner(aws)

    head: dict[str, Any] = {
        "InstanceType": aws.head_node.instance_type,
        "Networking": {"SubnetId": net.public_subnet_id},
        "Ssh": {"KeyName": aws.head_node.key_name},
        "LocalStorage": {"RootVolume": {"Size": aws.head_node.root_volume_gb, "VolumeType": "gp3", "Encrypted": True}},
        "Iam": {"AdditionalIamPolicies": _policies(aws, head=True)},
        "Imds": {"Secured": True},
        "CustomActions": {action(HEAD_SCRIPT).hook: {"Script": f"{uri}/{HEAD_SCRIPT}", "Args": [owner, group]}},
    }
    if net.ssh_cidr:
        head["Ssh"]["AllowedIps"] = net.ssh_cidr
    if net.head_security_group_id:
        head["Networking"]["AdditionalSecurityGroups"] = [net.head_security_group_id]

    queues = []
    for index, q in enumerate(aws.queues):
        facts = cat.get(q.instance_type)
        assert facts is not None  # checked above
        efa = facts.efa if q.efa is None else q.efa
        gpu_checks = facts.gpus > 0 if q.gpu_health_checks is None else q.gpu_health_checks
        resource: dict[str, Any] = {
            "Name": _resource_name(q.instance_type),
            "InstanceType": q.instance_type,
            "MinCount": q.static_nodes,
            "MaxCount": q.max_count,
            "Efa": {"Enabled": efa},
        }
        if q.capacity_reservation_id:
            resource["CapacityReservationTarget"] = {"CapacityReservationId": q.capacity_reservation_id}
        networking: dict[str, Any] = {"SubnetIds": [net.private_subnet_id], "PlacementGroup": {"Enabled": q.use_placement_group}}
        if net.compute_security_group_id:
            networking["AdditionalSecurityGroups"] = [net.compute_security_group_id]
        local: dict[str, Any] = {"RootVolume": {"Size": q.root_volume_gb, "VolumeType": "gp3", "Encrypted": True}}
        if facts.nvme_gb:
            local["EphemeralVolume"] = {"MountDir": aws.enroot.local_dir}
        queue: dict[str, Any] = {
            "Name": q.name,
            "CapacityType": q.capacity_type,
            "Networking": networking,
            "ComputeResources": [resource],
            "ComputeSettings": {"LocalStorage": local},
            "Iam": {"AdditionalIamPolicies": _policies(aws, head=False)},
            "JobExclusiveAllocation": queue_exclusive(project, index),
        }
        if "EphemeralVolume" in local:  # the script puts Enroot on the NVMe; a queue without one keeps Enroot's defaults
            queue["CustomActions"] = {action(COMPUTE_SCRIPT).hook: {"Script": f"{uri}/{COMPUTE_SCRIPT}"}}
        if gpu_checks:
            queue["HealthChecks"] = {"Gpu": {"Enabled": True}}
        queues.append(queue)

    config: dict[str, Any] = {
        "Region": aws.region,
        "Image": {"Os": aws.os},
        "HeadNode": head,
        "Scheduling": {
            "Scheduler": "slurm",
            "SlurmSettings": _slurm_settings(project, aws),
            "SlurmQueues": queues,
        },
    }
    storage = [_fsx(f, i, project) for i, f in enumerate(aws.fsx)] + [_ebs(e) for e in aws.ebs]
    if storage:
        config["SharedStorage"] = storage
    mon = aws.monitoring
    config["Monitoring"] = {
        "DetailedMonitoring": mon.detailed_monitoring,
        "Logs": {"CloudWatch": {"Enabled": mon.cloudwatch, "RetentionInDays": mon.log_retention_days}},
        "Dashboards": {"CloudWatch": {"Enabled": mon.cloudwatch}},
    }
    tags = {"clustertrain:project": project.name, **aws.tags}
    config["Tags"] = [{"Key": k, "Value": v} for k, v in tags.items()]
    return config


def _slurm_settings(project: "Project", aws: AwsConfig) -> dict[str, Any]:
    settings: dict[str, Any] = {"ScaledownIdletime": aws.scaledown_idletime}
    if memory_based_scheduling(project):  # models share nodes: each job's --mem is reserved (project_rules.py)
        settings["EnableMemoryBasedScheduling"] = True
    if any(q.reserved for q in aws.queues):
        # static nodes on reserved capacity: an update drains them instead of stopping the whole fleet
        settings["QueueUpdateStrategy"] = "DRAIN"
    return settings


def _resource_name(instance_type: str) -> str:
    return instance_type.replace(".", "-")[:50]


#: the FileSystemId of a file system the infrastructure stack has not created yet (an id in the AWS documentation's
#: form, so `check` reports it as one: an error naming `infra deploy`, a warning with aws.example_ids)
UNDEPLOYED_FSX = "fs-0123456789abcdef{}"


def _fsx(f, index: int, project: "Project") -> dict[str, Any]:
    """Every file system is mounted by id: one the project names (``file_system_id``), else the one the
    infrastructure stack created for it (clustertrain.cloud.infra: ParallelCluster creates at most one new FSx per
    cluster, ``MAX_NEW_STORAGE_COUNT`` in pcluster/constants.py; the stack creates any number, and they outlive the
    cluster)."""
    fs_id = f.file_system_id or deployed_fsx_id(project, f.name) or UNDEPLOYED_FSX.format(index % 10)
    return {"MountDir": f.mount_dir, "Name": f.name, "StorageType": "FsxLustre", "FsxLustreSettings": {"FileSystemId": fs_id}}


def _ebs(e) -> dict[str, Any]:
    return {
        "MountDir": e.mount_dir, "Name": e.name, "StorageType": "Ebs",
        "EbsSettings": {"Size": e.size_gb, "VolumeType": e.volume_type, "Encrypted": e.encrypted, "DeletionPolicy": "Retain"},
    }


def cluster_name(project: "Project") -> str:
    """aws.cluster_name, or the project name made into a valid ParallelCluster cluster name."""
    aws = require_aws(project)
    if aws.cluster_name:
        return aws.cluster_name
    name = re.sub(r"[^A-Za-z0-9-]", "-", project.name)
    return (name if name[:1].isalpha() else f"c-{name}")[:60]


def render_cluster_config(config: dict[str, Any], project_name: str, name: str = "NAME") -> str:
    header = (
        f"# AWS ParallelCluster 3 cluster config for project {project_name!r}, generated by clustertrain.\n"
        "# Check: clustertrain cluster validate THIS_FILE\n"
        f"# Create: pcluster create-cluster --cluster-name {name} --cluster-configuration THIS_FILE\n"
    )
    return header + dump_yaml(config)


class _NoAliasDumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump_yaml(value: Any) -> str:
    """Block-style YAML without anchors/aliases (CloudFormation rejects aliases)."""
    return yaml.dump(value, Dumper=_NoAliasDumper, sort_keys=False, default_flow_style=False, allow_unicode=True)
