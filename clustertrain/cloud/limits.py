"""Documented AWS limits that both the ``aws:`` section's validators (:mod:`clustertrain.cloud.config`)
and the rules for hand-written ParallelCluster files (:mod:`clustertrain.cloud.rules`) apply: FSx for
Lustre capacity steps and throughput tiers, ParallelCluster name rules, id formats, mount directories.
Constants and pure functions only, one copy of each fact; a leaf module (no clustertrain imports).
"""

from __future__ import annotations

import re

# Sources: FSx for Lustre user guide "Managing storage capacity" / "throughput capacity";
# ParallelCluster 3 config reference "SlurmQueues / Name", "ComputeResources / Name".

FSX_DEPLOYMENT_TYPES = ("SCRATCH_1", "SCRATCH_2", "PERSISTENT_1", "PERSISTENT_2")
FSX_THROUGHPUT = {"PERSISTENT_1": (50, 100, 200, 12, 40), "PERSISTENT_2": (125, 250, 500, 1000)}
FSX_COMPRESSION = ("LZ4", "NONE")
SUPPORTED_OS = ("alinux2023", "ubuntu2204", "ubuntu2404", "rhel8", "rhel9", "rocky8", "rocky9")
OS_DEFAULT_USER = {"alinux2023": "ec2-user", "ubuntu2204": "ubuntu", "ubuntu2404": "ubuntu",
                   "rhel8": "ec2-user", "rhel9": "ec2-user", "rocky8": "rocky", "rocky9": "rocky"}
QUEUE_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,24}$")
RESOURCE_NAME_RE = QUEUE_NAME_RE  # same rule for compute resources (pcluster NameValidator)
SUBNET_ID_RE = re.compile(r"^subnet-([0-9a-f]{8}|[0-9a-f]{17})$")
SG_ID_RE = re.compile(r"^sg-([0-9a-f]{8}|[0-9a-f]{17})$")
CR_ID_RE = re.compile(r"^cr-[0-9a-f]{17}$")
POLICY_ARN_RE = re.compile(r"^arn:aws(-[a-z]+)*:iam::(\d{12}|aws):policy/[\w+=,.@/-]+$")
DIR_KINDS = ("datasets", "checkpoints", "outputs", "logs", "tensorboard")


def fsx_capacity_problem(deployment: str, capacity_gb: int, throughput: int | None = None) -> str | None:
    """Why ``capacity_gb`` is not a valid StorageCapacity for this deployment type, or None (a size of zero or
    less gets the same message, rule and nearest valid size as any other)."""
    if deployment == "SCRATCH_1":
        ok = capacity_gb in (1200, 2400) or (capacity_gb > 2400 and capacity_gb % 3600 == 0)
        rule = "1200, 2400 or a multiple of 3600 GiB"
    elif deployment == "PERSISTENT_1" and throughput in (12, 40):
        step = 6000 if throughput == 12 else 1800
        ok, rule = capacity_gb % step == 0, f"a multiple of {step} GiB (HDD, {throughput} MB/s/TiB)"
    else:
        ok = capacity_gb == 1200 or capacity_gb % 2400 == 0
        rule = "1200 or a multiple of 2400 GiB"
    if ok and capacity_gb > 0:
        return None
    near = _nearest_capacity(deployment, capacity_gb, throughput)
    return f"StorageCapacity {capacity_gb} is not valid for {deployment}: use {rule} (nearest: {near})"


def _nearest_capacity(deployment: str, capacity_gb: int, throughput: int | None) -> int:
    if deployment == "PERSISTENT_1" and throughput in (12, 40):
        step = 6000 if throughput == 12 else 1800
        return max(step, -(-capacity_gb // step) * step)
    if capacity_gb <= 1200:
        return 1200
    step = 3600 if deployment == "SCRATCH_1" else 2400
    return max(2400, -(-capacity_gb // step) * step)


def fsx_throughput_problem(deployment: str, throughput: int | None) -> str | None:
    """Why ``throughput`` is not a valid PerUnitStorageThroughput for this deployment type, or None."""
    allowed = FSX_THROUGHPUT.get(deployment)
    if allowed is None:
        if throughput is not None:
            return f"PerUnitStorageThroughput applies only to PERSISTENT_1/PERSISTENT_2, not {deployment}; remove it"
        return None
    if throughput is None:
        return f"PerUnitStorageThroughput is required for {deployment}; choose one of {', '.join(map(str, allowed))}"
    if throughput not in allowed:
        return f"PerUnitStorageThroughput {throughput} is not valid for {deployment}: choose one of {', '.join(map(str, allowed))} MB/s/TiB"
    return None


def check_mount_dir(v: str) -> str:
    """``v`` when it is a mount directory ParallelCluster accepts and that shadows no system directory."""
    if not re.fullmatch(r"/[A-Za-z0-9._/-]*[A-Za-z0-9._-]", v) or "//" in v or "/../" in v + "/":
        raise ValueError(f"mount dir {v!r} must be an absolute path of letters, digits, '.', '_', '-', e.g. /fsx/data")
    reserved = ("/", "/home", "/opt", "/opt/slurm", "/opt/parallelcluster", "/opt/intel", "/etc", "/usr", "/var", "/tmp", "/root", "/boot", "/proc", "/sys", "/dev")
    if v in reserved:
        raise ValueError(f"mount dir {v!r} is a system directory; use e.g. /fsx/<name>")
    return v
