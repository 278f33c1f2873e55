"""Project-file section owned by the cloud stage: ``aws:`` (ParallelCluster, infrastructure).

It imports nothing from clustertrain but :mod:`clustertrain.core.schema` (the strict base) and
:mod:`clustertrain.cloud.limits`, so project.py can compose it. Facts that are pure arithmetic on the
documented AWS limits (FSx for Lustre capacity steps and throughput tiers, ParallelCluster name rules)
live in :mod:`clustertrain.cloud.limits`, so the project-file validators and the rules for hand-written
ParallelCluster files share one copy; they are re-exported here for the names' old importers.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from clustertrain.cloud.limits import (
    CR_ID_RE, DIR_KINDS, FSX_COMPRESSION, FSX_DEPLOYMENT_TYPES, FSX_THROUGHPUT, OS_DEFAULT_USER, POLICY_ARN_RE,
    QUEUE_NAME_RE, RESOURCE_NAME_RE, SG_ID_RE, SUBNET_ID_RE, SUPPORTED_OS, check_mount_dir, fsx_capacity_problem,
    fsx_throughput_problem,
)
from clustertrain.core.schema import StrictModel

__all__ = [
    "CONTAINERS_CACHE_NAME", "DOCKER_DATA_ROOT", "HEAD_ROOT_VOLUME_GB",
    "AwsConfig", "BucketsConfig", "EbsConfig", "EnrootConfig", "FsxConfig", "HeadNodeConfig", "MonitoringConfig",
    "NetworkConfig", "QueueConfig", "SharedDirsConfig",
    # re-exported from clustertrain.cloud.limits
    "CR_ID_RE", "DIR_KINDS", "FSX_COMPRESSION", "FSX_DEPLOYMENT_TYPES", "FSX_THROUGHPUT", "OS_DEFAULT_USER",
    "POLICY_ARN_RE", "QUEUE_NAME_RE", "RESOURCE_NAME_RE", "SG_ID_RE", "SUBNET_ID_RE", "SUPPORTED_OS",
    "check_mount_dir", "fsx_capacity_problem", "fsx_throughput_problem",
]


# ---------------------------------------------------------------------------------------------
# constants the node scripts write and other stages read

#: default head node root volume (GiB): awsome-distributed-training's for image builds (see HeadNodeConfig)
HEAD_ROOT_VOLUME_GB = 500
#: Docker's default data-root, on the head node's root volume
DOCKER_DATA_ROOT = "/var/lib/docker"
#: directory under ``aws.enroot.local_dir`` (the compute node's NVMe) that compute-node.sh creates mode 1777 for the
#: caches a container keeps under HOME or its image (Triton, Inductor, Transformer Engine); see
#: :attr:`EnrootConfig.containers_cache`
CONTAINERS_CACHE_NAME = "containers-cache"

# ---------------------------------------------------------------------------------------------
# sections


class HeadNodeConfig(StrictModel):
    instance_type: str = Field("c6i.4xlarge", description="Head node instance type (runs slurmctld; no GPU needed).")
    key_name: str | None = Field(
        None, description="EC2 key pair name for SSH to the head node (the name only: key material never goes in the project file)."
    )
    root_volume_gb: int = Field(
        HEAD_ROOT_VOLUME_GB, ge=35, le=16384,
        description="Head node root volume size in GiB (gp3). The default, 500, is awsome-distributed-training's head node "
                    "root volume for image builds (1.architectures/2.aws-parallelcluster/deployment-guides/templates/"
                    "cluster-vanilla.yaml): `clustertrain image build` keeps the NGC base, the build stage, the `docker save` "
                    "copy Enroot imports and Enroot's unpacked root on it at once (`image build --dry-run` computes the "
                    "build's footprint from the pins and refuses a place without the space).",
    )
    ssm: bool = Field(True, description="Attach AmazonSSMManagedInstanceCore so Session Manager can reach the head node.")
    docker: bool = Field(
        True,
        description="Install Docker on the head node (head-node.sh, OnNodeConfigured) so `clustertrain image build` runs "
                    "there: ParallelCluster AMIs ship Enroot and Pyxis but not Docker. Set false when images are built "
                    "elsewhere (then `image build` on the head node refuses: docker missing).",
    )
    docker_data_root: str = Field(
        DOCKER_DATA_ROOT,
        description="Docker's data-root on the head node (written to /etc/docker/daemon.json): the image layers and the "
                    "build cache. The default is on the root volume sized by `root_volume_gb`; an `aws.ebs` mount also "
                    "works. Not on FSx for Lustre: Docker's overlay2 driver needs an ext4 or xfs (ftype=1) backing "
                    "file system (Docker docs, 'OverlayFS storage driver').",
    )

    @field_validator("docker_data_root")
    @classmethod
    def _data_root(cls, v: str) -> str:
        if not re.fullmatch(r"/[A-Za-z0-9._/-]*[A-Za-z0-9._-]", v) or "//" in v or "/../" in v + "/" or "/./" in v + "/":
            raise ValueError(f"docker_data_root {v!r} must be an absolute path of letters, digits, '.', '_', '-', "
                             f"e.g. {DOCKER_DATA_ROOT}")
        if v in ("/", "/home", "/opt", "/etc", "/usr", "/var", "/tmp", "/root", "/boot", "/proc", "/sys", "/dev", "/run"):
            raise ValueError(f"docker_data_root {v!r} is a system directory; use a directory of its own, e.g. {DOCKER_DATA_ROOT}")
        return v


class NetworkConfig(StrictModel):
    vpc_cidr: str = Field("10.0.0.0/16", description="VPC CIDR for `clustertrain cluster infra`.")
    public_subnet_cidr: str = Field("10.0.0.0/24", description="Public subnet (head node, NAT gateway) CIDR; inside vpc_cidr.")
    private_subnet_cidr: str = Field("10.0.64.0/18", description="Private subnet (compute nodes, FSx) CIDR; inside vpc_cidr.")
    public_subnet_id: str | None = Field(
        None, description="Existing public subnet for the head node (the infra stack's `PublicSubnetId` output). Required by `cluster config`."
    )
    private_subnet_id: str | None = Field(
        None, description="Existing private subnet for compute nodes and FSx (the infra stack's `PrivateSubnetId` output). Required by `cluster config`."
    )
    head_security_group_id: str | None = Field(None, description="Extra security group for the head node (infra output `HeadNodeSecurityGroupId`).")
    compute_security_group_id: str | None = Field(None, description="Extra security group for compute nodes (infra output `ComputeSecurityGroupId`).")
    ssh_cidr: str | None = Field(
        None, description="The only CIDR allowed to SSH to the head node, e.g. `203.0.113.0/24`. None: no SSH ingress (use Session Manager)."
    )

    @field_validator("vpc_cidr", "public_subnet_cidr", "private_subnet_cidr", "ssh_cidr")
    @classmethod
    def _cidr(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            net = ipaddress.ip_network(v, strict=True)
        except ValueError:
            raise ValueError(f"{v!r} is not a CIDR block with its host bits zero, e.g. 10.0.0.0/16") from None
        if not isinstance(net, ipaddress.IPv4Network):
            raise ValueError(f"{v!r}: use an IPv4 CIDR")
        return v

    @field_validator("public_subnet_id", "private_subnet_id")
    @classmethod
    def _subnet(cls, v: str | None) -> str | None:
        if v is not None and not SUBNET_ID_RE.match(v):
            raise ValueError(f"{v!r} is not a subnet id like subnet-0123456789abcdef0")
        return v

    @field_validator("head_security_group_id", "compute_security_group_id")
    @classmethod
    def _sg(cls, v: str | None) -> str | None:
        if v is not None and not SG_ID_RE.match(v):
            raise ValueError(f"{v!r} is not a security group id like sg-0123456789abcdef0")
        return v

    @model_validator(mode="after")
    def _inside(self) -> "NetworkConfig":
        vpc = ipaddress.ip_network(self.vpc_cidr)
        pub, priv = ipaddress.ip_network(self.public_subnet_cidr), ipaddress.ip_network(self.private_subnet_cidr)
        for key, net in (("public_subnet_cidr", pub), ("private_subnet_cidr", priv)):
            if not net.subnet_of(vpc):  # type: ignore[arg-type]
                raise ValueError(f"{key} {net} is not inside vpc_cidr {vpc}; pick a block inside it")
        if pub.overlaps(priv):
            raise ValueError(f"public_subnet_cidr {pub} overlaps private_subnet_cidr {priv}; use separate blocks")
        return self


class QueueConfig(StrictModel):
    """One Slurm queue with one compute resource.

    Defaults that depend on the capacity (None = derived, see :meth:`static_nodes` and
    :meth:`use_placement_group`): with a capacity reservation (a targeted ODCR or a Capacity Block)
    the nodes are static (``min_count = max_count``: the capacity is paid for anyway, and a Capacity
    Block requires it) and there is no cluster placement group (ParallelCluster warns that a
    placement group beside a targeted ODCR can fail with insufficient capacity; a Capacity Block
    needs none). Without a reservation: ``min_count 0`` and a placement group for EFA types.
    """

    name: str = Field(..., description="Slurm partition name: lowercase letters, digits and '-', starting with a letter, at most 25 characters.")
    instance_type: str = Field(..., description="Compute instance type, e.g. `p5e.48xlarge` (must be in the cloud catalog).")
    min_count: int | None = Field(
        None, ge=0,
        description="Instances kept running (static nodes). Default: `max_count` with a capacity reservation or Capacity Block "
                    "(static nodes; a Capacity Block requires min = max), else 0 (Slurm scales down to zero).",
    )
    max_count: int = Field(..., ge=1, description="Most instances this queue can launch (with a reservation: its instance count).")
    capacity_type: Literal["ONDEMAND", "SPOT", "CAPACITY_BLOCK"] = Field("ONDEMAND", description="How instances are bought.")
    capacity_reservation_id: str | None = Field(
        None, description="On-Demand Capacity Reservation (ODCR) or Capacity Block id to target, e.g. `cr-0a1b2c3d4e5f67890`."
    )
    efa: bool | None = Field(None, description="Enable EFA. Default: on when the instance type supports it.")
    placement_group: bool | None = Field(
        None,
        description="Launch the queue's nodes in a cluster placement group. Default: off with a capacity reservation or Capacity "
                    "Block (ParallelCluster warns of insufficient-capacity errors beside a targeted ODCR; a Capacity Block needs "
                    "none), else on.",
    )
    gpu_health_checks: bool | None = Field(None, description="Slurm GPU health checks before jobs. Default: on for GPU instances.")
    root_volume_gb: int = Field(200, ge=35, le=16384, description="Compute node root volume in GiB (gp3); containers and caches go to local NVMe, not here.")
    exclusive: bool | None = Field(
        None,
        description="Whole-node jobs only (`JobExclusiveAllocation`). Default: true, except on the queue that runs models "
                    "sharing nodes (`models[].plan.gpus` below a node's: `cluster.partition`, else every queue), where it is "
                    "false: Slurm could not place a second share beside the first. `true` there is an error.",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not QUEUE_NAME_RE.match(v) or v == "default":
            raise ValueError(f"queue name {v!r} must be lowercase letters, digits and '-', start with a letter, at most 25 characters, not 'default'")
        return v

    @field_validator("capacity_reservation_id")
    @classmethod
    def _cr(cls, v: str | None) -> str | None:
        if v is not None and not CR_ID_RE.match(v):
            raise ValueError(f"capacity_reservation_id {v!r} must look like cr-0a1b2c3d4e5f67890")
        return v

    @model_validator(mode="after")
    def _check(self) -> "QueueConfig":
        if self.min_count is not None and self.min_count > self.max_count:
            raise ValueError(f"min_count ({self.min_count}) exceeds max_count ({self.max_count}); set min_count <= max_count")
        if self.capacity_type == "SPOT" and self.capacity_reservation_id:
            raise ValueError("capacity_reservation_id cannot be used with capacity_type SPOT; use ONDEMAND (ODCR) or CAPACITY_BLOCK")
        if self.capacity_type == "CAPACITY_BLOCK" and not self.capacity_reservation_id:
            raise ValueError("capacity_type CAPACITY_BLOCK needs capacity_reservation_id (the Capacity Block's cr- id)")
        return self

    @property
    def reserved(self) -> bool:
        """The queue targets reserved capacity (a targeted ODCR or a Capacity Block)."""
        return self.capacity_reservation_id is not None

    @property
    def static_nodes(self) -> int:
        """MinCount: the explicit min_count, else max_count with reserved capacity, else 0."""
        if self.min_count is not None:
            return self.min_count
        return self.max_count if self.reserved else 0

    @property
    def use_placement_group(self) -> bool:
        """The explicit placement_group, else off with reserved capacity and on without."""
        if self.placement_group is not None:
            return self.placement_group
        return not self.reserved


class FsxConfig(StrictModel):
    name: str = Field(..., description="Storage name in the cluster config (letters, digits, '-', '_').")
    mount_dir: str = Field(..., description="Absolute mount point on every node, e.g. `/fsx/data`.")
    capacity_gb: int = Field(1200, description="StorageCapacity in GiB: 1200 or multiples of 2400 (SCRATCH_2, PERSISTENT_1/2 SSD).")
    throughput: int | None = Field(
        None, description="PerUnitStorageThroughput in MB/s/TiB: PERSISTENT_2 125/250/500/1000 (default 250); PERSISTENT_1 50/100/200 (default 200); none for SCRATCH."
    )
    deployment_type: Literal["SCRATCH_1", "SCRATCH_2", "PERSISTENT_1", "PERSISTENT_2"] = Field(
        "PERSISTENT_2", description="FSx for Lustre deployment type."
    )
    compression: Literal["LZ4", "NONE"] = Field("LZ4", description="Data compression (LZ4 saves capacity on checkpoints and text).")
    file_system_id: str | None = Field(
        None, description="Mount a file system you created (`fs-...`). Without it the infrastructure stack creates this one "
                          "(`clustertrain cluster infra deploy`; ParallelCluster itself creates at most one) and the cluster "
                          "mounts it by the id the stack recorded.")
    holds: list[Literal["datasets", "checkpoints", "outputs", "logs", "tensorboard"]] = Field(
        default_factory=list,
        description="Per-model directories created on this file system. Kinds no file system names go to the first one.",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,29}", v):
            raise ValueError(f"storage name {v!r} must be 1-30 letters, digits, '-' or '_'")
        return v

    @field_validator("mount_dir")
    @classmethod
    def _mount(cls, v: str) -> str:
        return check_mount_dir(v)

    @model_validator(mode="after")
    def _check(self) -> "FsxConfig":
        if self.file_system_id is None:
            problem = fsx_throughput_problem(self.deployment_type, self.effective_throughput)
            problem = problem or fsx_capacity_problem(self.deployment_type, self.capacity_gb, self.effective_throughput)
            if problem:
                raise ValueError(problem.replace("StorageCapacity", "capacity_gb").replace("PerUnitStorageThroughput", "throughput"))
        elif not re.fullmatch(r"fs-[0-9a-f]{17}", self.file_system_id):
            raise ValueError(f"file_system_id {self.file_system_id!r} must look like fs-0123456789abcdef0")
        return self

    @property
    def effective_throughput(self) -> int | None:
        if self.throughput is not None:
            return self.throughput
        return {"PERSISTENT_2": 250, "PERSISTENT_1": 200}.get(self.deployment_type)


class EbsConfig(StrictModel):
    name: str = Field(..., description="Storage name in the cluster config.")
    mount_dir: str = Field(..., description="Absolute mount point (shared from the head node over NFS).")
    size_gb: int = Field(500, ge=1, le=16384, description="Volume size in GiB.")
    volume_type: Literal["gp3", "gp2", "io1", "io2", "st1", "sc1"] = Field("gp3", description="EBS volume type.")
    encrypted: bool = Field(True, description="Encrypt the volume.")

    @field_validator("mount_dir")
    @classmethod
    def _mount(cls, v: str) -> str:
        return check_mount_dir(v)


class BucketsConfig(StrictModel):
    data: str | None = Field(None, description="Data bucket name (compute nodes read it). Default: the bucket of storage.data_bucket.")
    checkpoints: str | None = Field(
        None, description="Checkpoint bucket name (compute nodes write it; versioned). Default: the bucket of storage.checkpoint_bucket."
    )

    @field_validator("data", "checkpoints")
    @classmethod
    def _bucket(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", v):
            raise ValueError(f"bucket name {v!r} must be 3-63 lowercase letters, digits, '.' or '-' (a name, not s3://...)")
        return v


class MonitoringConfig(StrictModel):
    cloudwatch: bool = Field(True, description="Send cluster logs to CloudWatch Logs and create the CloudWatch dashboard.")
    log_retention_days: int = Field(14, description="CloudWatch log retention in days (a value CloudWatch accepts, e.g. 7, 14, 30, 90).")
    detailed_monitoring: bool = Field(False, description="1-minute EC2 metrics (costs extra).")

    @field_validator("log_retention_days")
    @classmethod
    def _retention(cls, v: int) -> int:
        allowed = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653)
        if v not in allowed:
            raise ValueError(f"log_retention_days {v} is not a CloudWatch retention; choose one of {', '.join(map(str, allowed))}")
        return v


class SharedDirsConfig(StrictModel):
    owner: str | None = Field(None, description="Owner of the per-model directories. Default: the OS's default user (ec2-user on alinux2023).")
    group: str | None = Field(None, description="Group of the per-model directories. Default: the owner.")
    mode: str = Field("2775", description="Octal mode of the per-model directories (2775: group-writable, setgid keeps the group).")
    mount_timeout_s: int = Field(600, ge=10, le=7200, description="How long the setup script waits for the shared file systems to mount.")

    @field_validator("mode")
    @classmethod
    def _mode(cls, v: str) -> str:
        if not re.fullmatch(r"[0-7]{3,4}", v):
            raise ValueError(f"mode {v!r} must be 3 or 4 octal digits, e.g. 2775")
        return v

    @field_validator("owner", "group")
    @classmethod
    def _user(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", v):
            raise ValueError(f"{v!r} is not a POSIX user/group name")
        return v


class EnrootConfig(StrictModel):
    local_dir: str = Field(
        "/scratch", description="Local NVMe mount on compute nodes (ParallelCluster's EphemeralVolume): Enroot caches and container data go here, not to the root volume."
    )

    @field_validator("local_dir")
    @classmethod
    def _dir(cls, v: str) -> str:
        return check_mount_dir(v)

    @property
    def containers_cache(self) -> str:
        """``<local_dir>/containers-cache``: created by compute-node.sh on every compute node's NVMe, mode 1777 (any
        job user may write, only the owner deletes), for the caches containers would write under HOME (not mounted)
        or the image: Triton, Inductor (``torch.compile``), Transformer Engine."""
        return f"{self.local_dir}/{CONTAINERS_CACHE_NAME}"


class AwsConfig(StrictModel):
    region: str = Field(..., description="AWS region, e.g. `ap-southeast-3`.")
    availability_zone: str | None = Field(None, description="Availability zone for subnets and FSx, e.g. `ap-southeast-3a`. Required by `cluster infra`.")
    os: Literal["alinux2023", "ubuntu2204", "ubuntu2404", "rhel8", "rhel9", "rocky8", "rocky9"] = Field(
        "alinux2023", description="Node operating system (ParallelCluster 3.16 no longer accepts alinux2)."
    )
    cluster_name: str | None = Field(None, description="ParallelCluster cluster name (used in tags and docs). Default: the project name.")
    infra_stack_name: str | None = Field(
        None, description="CloudFormation stack that `clustertrain cluster infra deploy` creates (VPC, subnets, security groups, "
                          "buckets, node policy, FSx file systems). Default: `<cluster name>-infra`.",
    )
    head_node: HeadNodeConfig = Field(default_factory=HeadNodeConfig, description="The head node.")
    network: NetworkConfig = Field(default_factory=NetworkConfig, description="VPC, subnets, security groups and SSH access.")
    queues: list[QueueConfig] = Field(..., min_length=1, description="Slurm queues (one compute resource each).")
    fsx: list[FsxConfig] = Field(default_factory=list, description="FSx for Lustre file systems.")
    ebs: list[EbsConfig] = Field(default_factory=list, description="EBS volumes shared from the head node (optional).")
    buckets: BucketsConfig = Field(default_factory=BucketsConfig, description="S3 buckets created by `cluster infra` and granted to compute nodes.")
    scripts_s3_uri: str | None = Field(
        None, description="`s3://bucket/prefix` where the node scripts are uploaded. Default: `s3://<data bucket>/clustertrain/node-scripts`."
    )
    storage_policy_arn: str | None = Field(
        None,
        description="ARN of the IAM managed policy that grants the nodes exactly the S3 access clustertrain uses (the infra "
                    "stack's `StoragePolicyArn` output, from `clustertrain cluster infra`). Attached to the head node and every "
                    "queue; required when the project has buckets. Replaces ParallelCluster's `S3Access`, whose write access is `s3:*`.",
    )
    additional_iam_policies: list[str] = Field(
        default_factory=list, description="Extra IAM policy ARNs for the head node and compute nodes (beyond `storage_policy_arn`)."
    )
    example_ids: bool = Field(
        False,
        description="Set only in example project files: the subnet, security group, capacity reservation, key pair and policy ids "
                    "are documentation placeholders (`subnet-0123456789abcdef0`, account `123456789012`). `clustertrain check` then "
                    "reports them as warnings instead of errors; remove this flag once the real ids are filled in.",
    )
    tags: dict[str, str] = Field(default_factory=dict, description="Tags on every resource (cluster and infra stack).")
    monitoring: MonitoringConfig = Field(default_factory=MonitoringConfig, description="CloudWatch logs, dashboard and metrics.")
    shared_dirs: SharedDirsConfig = Field(default_factory=SharedDirsConfig, description="Owner and mode of the per-model directories.")
    enroot: EnrootConfig = Field(default_factory=EnrootConfig, description="Where Enroot/Pyxis keep caches and container data.")
    scaledown_idletime: int = Field(10, ge=1, description="Minutes an idle dynamic node waits before it is terminated.")
    memory_based_scheduling: bool | None = Field(
        None,
        description="ParallelCluster's `Scheduling.SlurmSettings.EnableMemoryBasedScheduling` (host memory a consumable "
                    "resource: `SelectTypeParameters=CR_CPU_Memory`, jobs ask `--mem`). Default: on when any model shares "
                    "nodes (`models[].plan.gpus` below a node's), else off (ParallelCluster's default). `false` while "
                    "models share nodes is an error: their jobs could overfill a node's memory.",
    )

    @field_validator("region")
    @classmethod
    def _region(cls, v: str) -> str:
        if not re.fullmatch(r"[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d", v):
            raise ValueError(f"region {v!r} is not an AWS region name, e.g. ap-southeast-3")
        return v

    @field_validator("cluster_name")
    @classmethod
    def _cluster_name(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z][A-Za-z0-9-]{0,59}", v):
            raise ValueError(f"cluster_name {v!r} must start with a letter and hold only letters, digits and '-' (at most 60)")
        return v

    @field_validator("infra_stack_name")
    @classmethod
    def _stack_name(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z][A-Za-z0-9-]{0,127}", v):
            raise ValueError(f"infra_stack_name {v!r} must start with a letter and hold only letters, digits and '-' (at most 128)")
        return v

    @field_validator("scripts_s3_uri")
    @classmethod
    def _s3(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[A-Za-z0-9._/-]*)?", v):
            raise ValueError(f"scripts_s3_uri {v!r} must look like s3://bucket/prefix")
        return v.rstrip("/") if v else v

    @field_validator("storage_policy_arn", "additional_iam_policies")
    @classmethod
    def _policy_arn(cls, v):
        for arn in [v] if isinstance(v, str) else (v or []):
            if not POLICY_ARN_RE.match(arn):
                raise ValueError(f"{arn!r} is not an IAM policy ARN like arn:aws:iam::111122223333:policy/NAME")
        return v

    @field_validator("tags")
    @classmethod
    def _tags(cls, v: dict[str, str]) -> dict[str, str]:
        for k in v:
            if k.lower().startswith("aws:") or k.startswith("parallelcluster:"):
                raise ValueError(f"tag key {k!r} uses a reserved prefix (aws:, parallelcluster:); rename it")
        return v

    @model_validator(mode="after")
    def _check(self) -> "AwsConfig":
        if self.availability_zone and not re.fullmatch(re.escape(self.region) + r"[a-z]", self.availability_zone):
            raise ValueError(f"availability_zone {self.availability_zone!r} is not in region {self.region}; e.g. {self.region}a")
        names = [q.name for q in self.queues]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"queue name {dup[0]!r} is used twice; queue names must be unique")
        mounts = [s.mount_dir for s in self.fsx] + [s.mount_dir for s in self.ebs]
        dupm = sorted({m for m in mounts if mounts.count(m) > 1})
        if dupm:
            raise ValueError(f"mount dir {dupm[0]!r} is used by two file systems; give each its own mount_dir")
        snames = [s.name for s in self.fsx] + [s.name for s in self.ebs]
        dups = sorted({n for n in snames if snames.count(n) > 1})
        if dups:
            raise ValueError(f"storage name {dups[0]!r} is used twice; storage names must be unique")
        root = self.head_node.docker_data_root
        on_fsx = [f.mount_dir for f in self.fsx if root == f.mount_dir or root.startswith(f.mount_dir.rstrip("/") + "/")]
        if self.head_node.docker and on_fsx:
            raise ValueError(f"head_node.docker_data_root {root!r} is on the FSx for Lustre mount {on_fsx[0]}, which Docker's "
                             f"overlay2 driver cannot use (ext4 or xfs only); keep the default {DOCKER_DATA_ROOT} on the "
                             "root volume or use an aws.ebs mount")
        held = [k for s in self.fsx for k in s.holds]
        duph = sorted({k for k in held if held.count(k) > 1})
        if duph:
            raise ValueError(f"directory kind {duph[0]!r} is held by two file systems; list it under one fsx[].holds")
        return self

    def layout(self) -> dict[str, str]:
        """Directory kind -> mount dir holding it (kinds nobody names go to the first shared file system)."""
        stores = [(s.mount_dir, list(s.holds)) for s in self.fsx] + [(e.mount_dir, []) for e in self.ebs]
        if not stores:
            return {}
        out = {k: d for d, holds in stores for k in holds}
        return {k: out.get(k, stores[0][0]) for k in DIR_KINDS}
