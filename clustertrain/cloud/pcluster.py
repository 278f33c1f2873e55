"""Build the AWS ParallelCluster 3.x cluster configuration from a project (a plain dict, dumped as YAML).

The config is a value first: :func:`build_cluster_config` returns the dict, :func:`render_cluster_config`
the YAML text with a header naming the tool. Nothing here talks to AWS.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import yaml

from clustertrain.cloud.catalog import InstanceCatalog, load_catalog
from clustertrain.cloud.config import OS_DEFAULT_USER, AwsConfig
from clustertrain.errors import ConfigError

if TYPE_CHECKING:
    from clustertrain.project import Project

SSM_POLICY = "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"
HEAD_SCRIPT = "head-node.sh"
COMPUTE_SCRIPT = "compute-node.sh"
SETUP_DIRS_SCRIPT = "setup-dirs.sh"


def require_aws(project: "Project") -> AwsConfig:
    if project.aws is None:
        raise ConfigError(f"project {project.name!r} has no `aws:` section; add one (see docs/cloud.md and examples/p5e-80x7.yaml)")
    return project.aws


def bucket_of(uri: str | None) -> str | None:
    """`s3://bucket/prefix` -> `bucket`; None for anything that is not an s3:// URI."""
    if not uri or not uri.startswith("s3://"):
        return None
    return uri[5:].split("/", 1)[0] or None


def data_bucket(project: "Project") -> str | None:
    aws = require_aws(project)
    return aws.buckets.data or bucket_of(project.storage.data_bucket)


def checkpoint_bucket(project: "Project") -> str | None:
    aws = require_aws(project)
    return aws.buckets.checkpoints or bucket_of(project.storage.checkpoint_bucket)


def scripts_uri(project: "Project") -> str:
    aws = require_aws(project)
    if aws.scripts_s3_uri:
        return aws.scripts_s3_uri
    bucket = data_bucket(project)
    if bucket is None:
        raise ConfigError(
            "aws.scripts_s3_uri is not set and there is no data bucket to default to; "
            "set aws.scripts_s3_uri (e.g. s3://my-bucket/clustertrain/node-scripts) or aws.buckets.data"
        )
    return f"s3://{bucket}/clustertrain/node-scripts"


def dir_owner(aws: AwsConfig) -> tuple[str, str]:
    owner = aws.shared_dirs.owner or OS_DEFAULT_USER[aws.os]
    return owner, aws.shared_dirs.group or owner


def check_project_aws(project: "Project", catalog: InstanceCatalog | None = None) -> AwsConfig:
    """Checks that need the instance catalog or several sections; raises ConfigError naming the field."""
    aws = require_aws(project)
    cat = catalog or load_catalog()
    if aws.region not in cat.regions:
        raise ConfigError(f"aws.region {aws.region!r} is not an AWS region known to clustertrain; e.g. ap-southeast-3, us-east-1")
    for i, q in enumerate(aws.queues):
        facts = cat.get(q.instance_type)
        where = f"aws.queues[{i}].instance_type"
        if facts is None:
            raise ConfigError(
                f"{where}: unknown instance type {q.instance_type!r}; known: {', '.join(cat.suggest(q.instance_type))} "
                "(add new types to clustertrain/cloud/instances.yaml)"
            )
        if cat.offered(q.instance_type, aws.region) is False:
            raise ConfigError(
                f"{where}: {q.instance_type} is not offered in {aws.region}; use one of {', '.join(facts.regions or ())} or another type"
            )
        if q.efa and not facts.efa:
            raise ConfigError(f"aws.queues[{i}].efa: {q.instance_type} does not support EFA; remove efa or pick an EFA type (e.g. p5e.48xlarge)")
        if q.gpu_health_checks and facts.gpus == 0:
            raise ConfigError(f"aws.queues[{i}].gpu_health_checks: {q.instance_type} has no NVIDIA GPU; set gpu_health_checks: false")
    cl = project.cluster
    if cl.partition is not None:
        names = [q.name for q in aws.queues]
        if cl.partition not in names:
            raise ConfigError(f"cluster.partition {cl.partition!r} is not one of aws.queues ({', '.join(names)}); rename the queue or the partition")
        i = names.index(cl.partition)
        q = aws.queues[i]
        if cl.instance_type and cl.instance_type != q.instance_type:
            raise ConfigError(
                f"cluster.instance_type {cl.instance_type} differs from aws.queues[{i}].instance_type {q.instance_type}; make them the same"
            )
        if cl.nodes > q.max_count:
            raise ConfigError(f"cluster.nodes ({cl.nodes}) exceeds aws.queues[{i}].max_count ({q.max_count}); raise max_count or lower nodes")
    if aws.network.public_subnet_id is None:
        raise ConfigError(
            "aws.network.public_subnet_id is missing (head node subnet); deploy `clustertrain cluster infra` and copy its PublicSubnetId output"
        )
    if aws.network.private_subnet_id is None:
        raise ConfigError(
            "aws.network.private_subnet_id is missing (compute/FSx subnet); deploy `clustertrain cluster infra` and copy its PrivateSubnetId output"
        )
    if aws.head_node.key_name is None:
        raise ConfigError("aws.head_node.key_name is missing; set it to the name of an EC2 key pair in the region (the name only)")
    return aws


def _s3_access(project: "Project", write_checkpoints: bool) -> list[dict[str, Any]]:
    access: list[dict[str, Any]] = []
    scripts_bucket = bucket_of(scripts_uri(project))
    data, ckpt = data_bucket(project), checkpoint_bucket(project)
    if data:
        access.append({"BucketName": data})
    if scripts_bucket and scripts_bucket not in (data, ckpt):
        access.append({"BucketName": scripts_bucket})
    if ckpt:
        access.append({"BucketName": ckpt, "EnableWriteAccess": write_checkpoints} if write_checkpoints else {"BucketName": ckpt})
    return access


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
        "Iam": {"S3Access": _s3_access(project, write_checkpoints=True)},
        "Imds": {"Secured": True},
        "CustomActions": {"OnNodeConfigured": {"Script": f"{uri}/{HEAD_SCRIPT}", "Args": [owner, group]}},
    }
    if net.ssh_cidr:
        head["Ssh"]["AllowedIps"] = net.ssh_cidr
    if net.head_security_group_id:
        head["Networking"]["AdditionalSecurityGroups"] = [net.head_security_group_id]
    if aws.head_node.ssm:
        head["Iam"]["AdditionalIamPolicies"] = [{"Policy": SSM_POLICY}]

    queues = []
    for q in aws.queues:
        facts = cat.get(q.instance_type)
        assert facts is not None  # checked above
        efa = facts.efa if q.efa is None else q.efa
        gpu_checks = facts.gpus > 0 if q.gpu_health_checks is None else q.gpu_health_checks
        resource: dict[str, Any] = {
            "Name": _resource_name(q.instance_type),
            "InstanceType": q.instance_type,
            "MinCount": q.min_count,
            "MaxCount": q.max_count,
            "Efa": {"Enabled": efa},
        }
        if q.capacity_reservation_id:
            resource["CapacityReservationTarget"] = {"CapacityReservationId": q.capacity_reservation_id}
        networking: dict[str, Any] = {"SubnetIds": [net.private_subnet_id], "PlacementGroup": {"Enabled": q.placement_group}}
        if net.compute_security_group_id:
            networking["AdditionalSecurityGroups"] = [net.compute_security_group_id]
        local: dict[str, Any] = {"RootVolume": {"Size": q.root_volume_gb, "VolumeType": "gp3", "Encrypted": True}}
        if facts.nvme_gb:
            local["EphemeralVolume"] = {"MountDir": aws.enroot.local_dir}
        iam: dict[str, Any] = {"S3Access": _s3_access(project, write_checkpoints=True)}
        if aws.additional_iam_policies:
            iam["AdditionalIamPolicies"] = [{"Policy": arn} for arn in aws.additional_iam_policies]
        queue: dict[str, Any] = {
            "Name": q.name,
            "CapacityType": q.capacity_type,
            "Networking": networking,
            "ComputeResources": [resource],
            "ComputeSettings": {"LocalStorage": local},
            "Iam": iam,
            "CustomActions": {"OnNodeStart": {"Script": f"{uri}/{COMPUTE_SCRIPT}"}},
            "JobExclusiveAllocation": q.exclusive,
        }
        if gpu_checks:
            queue["HealthChecks"] = {"Gpu": {"Enabled": True}}
        queues.append(queue)

    config: dict[str, Any] = {
        "Region": aws.region,
        "Image": {"Os": aws.os},
        "HeadNode": head,
        "Scheduling": {
            "Scheduler": "slurm",
            "SlurmSettings": {"ScaledownIdletime": aws.scaledown_idletime},
            "SlurmQueues": queues,
        },
    }
    storage = [_fsx(f) for f in aws.fsx] + [_ebs(e) for e in aws.ebs]
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


def _resource_name(instance_type: str) -> str:
    return instance_type.replace(".", "-")[:50]


def _fsx(f) -> dict[str, Any]:
    if f.file_system_id:
        settings: dict[str, Any] = {"FileSystemId": f.file_system_id}
    else:
        settings = {"StorageCapacity": f.capacity_gb, "DeploymentType": f.deployment_type}
        if f.effective_throughput is not None:
            settings["PerUnitStorageThroughput"] = f.effective_throughput
        if f.compression == "LZ4":
            settings["DataCompressionType"] = "LZ4"
        settings["DeletionPolicy"] = "Retain"
    return {"MountDir": f.mount_dir, "Name": f.name, "StorageType": "FsxLustre", "FsxLustreSettings": settings}


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
