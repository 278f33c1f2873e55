"""clustertrain's own offline rules for a ParallelCluster 3 config: what the schema does not catch.

Sources: the FSx for Lustre user guide (capacity steps, throughput tiers), the ParallelCluster 3
configuration reference (queue/compute resource names, Os values, where SlurmQueues and IAM
policies belong), the EC2 EFA guide (EFA instance types), and our instance catalog. Every finding
names the YAML path and the fix. Rules never call AWS.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from clustertrain.cloud.catalog import INSTANCE_TYPE_RE, InstanceCatalog, load_catalog
from clustertrain.cloud.phases import phase_findings
from clustertrain.core.findings import Finding, Level  # noqa: F401 - re-exported for cloud's callers
from clustertrain.cloud.config import (
    FSX_DEPLOYMENT_TYPES,
    QUEUE_NAME_RE,
    SUPPORTED_OS,
    fsx_capacity_problem,
    fsx_throughput_problem,
)

PLACEHOLDER_RE = re.compile(r"(x{6,}|-([a-z])\2{5,}$|your[-_]|YOUR_|<[^>]+>|CHANGE_?ME|REPLACE_?ME)", re.IGNORECASE)
#: ids as the AWS documentation writes them: subnet-0123456789abcdef0, sg-0fedcba9876543210, cr-1234567890abcdef0,
#: account 123456789012 / 111122223333 in ARNs. Real ids are random hex; these runs never occur by chance.
DOC_ID_RE = re.compile(
    r"\b(?:subnet|sg|cr|vpc|fs|i|ami|igw|nat|rtb|eni|vol|snap|pg|eipalloc|key|lt)-[0-9a-f]*"
    r"(?:0123456789abcdef|fedcba9876543210|1234567890abcdef|abcdef0123456789|01234567|76543210|12345678|abcdef01)[0-9a-f]*\b"
    r"|:(?:123456789012|111122223333|444455556666|999999999999|000000000000):",
    re.IGNORECASE,
)
DOC_ID_MESSAGE = "is an id from the AWS documentation, not a real resource"
SECRET_RE = re.compile(r"(AKIA|ASIA)[0-9A-Z]{16}|-----BEGIN [A-Z ]*PRIVATE KEY-----")
RESERVED_MOUNTS = {"/", "/home", "/opt", "/opt/slurm", "/opt/parallelcluster", "/opt/intel", "/etc", "/usr", "/var",
                   "/tmp", "/root", "/boot", "/proc", "/sys", "/dev", "/scratch"}


def _p(*parts: object) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _d(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _l(value: Any) -> list:
    return value if isinstance(value, list) else []


def check_cluster_config(config: dict[str, Any], catalog: InstanceCatalog | None = None) -> list[Finding]:
    """Run every rule; returns findings in document order (errors and warnings)."""
    cat = catalog or load_catalog()
    out: list[Finding] = []
    out += _top_level(config)
    out += _image(config)
    region = config.get("Region")
    out += _region(region, cat)
    total_nodes = 0
    queues, n = _queues(config, cat, region if isinstance(region, str) else None)
    out += queues
    total_nodes += n
    out += _head_node(_d(config.get("HeadNode")), cat, total_nodes, "HeadNode" in config)
    out += _shared_storage(_l(config.get("SharedStorage")))
    out += _values(config)
    out += phase_findings(config)
    return out


def _top_level(config: dict) -> Iterator[Finding]:
    if "SlurmQueues" in config:
        yield Finding("error", "SlurmQueues", "SlurmQueues is at the top level, where ParallelCluster does not look for it",
                      "move it under Scheduling (Scheduling.SlurmQueues)")
    if "Scheduling" not in config:
        yield Finding("error", "Scheduling", "the Scheduling section is missing",
                      "add Scheduling: {Scheduler: slurm, SlurmQueues: [...]}")
    elif "SlurmQueues" not in _d(config["Scheduling"]) and "SlurmQueues" not in config:
        yield Finding("error", "Scheduling.SlurmQueues", "no queues are defined", "add Scheduling.SlurmQueues with at least one queue")
    iam = _d(config.get("Iam"))
    for key in ("AdditionalIamPolicies", "S3Access"):
        if key in iam:
            yield Finding("error", _p("Iam", key), f"{key} is not accepted in the top-level Iam section",
                          f"put it under HeadNode.Iam.{key} and/or Scheduling.SlurmQueues[i].Iam.{key}")


def _image(config: dict) -> Iterator[Finding]:
    os_name = _d(config.get("Image")).get("Os")
    if os_name is None:
        yield Finding("error", "Image.Os", "the operating system is missing", "add Image.Os: alinux2023 (or ubuntu2204)")
    elif os_name not in SUPPORTED_OS:
        extra = " (Amazon Linux 2 is not supported by ParallelCluster 3.16)" if os_name == "alinux2" else ""
        yield Finding("error", "Image.Os", f"Os {os_name!r} is not supported{extra}",
                      f"use one of {', '.join(SUPPORTED_OS)}, e.g. alinux2023 or ubuntu2204")


def _region(region: Any, cat: InstanceCatalog) -> Iterator[Finding]:
    if region is None:
        yield Finding("warning", "Region", "no Region in the file; pcluster will use AWS_DEFAULT_REGION or --region",
                      "add Region: <your region> so the file is self-contained")
    elif region not in cat.regions:
        yield Finding("error", "Region", f"{region!r} is not an AWS region", "use a region name such as ap-southeast-3")


def _head_node(head: dict, cat: InstanceCatalog, total_nodes: int, present: bool) -> Iterator[Finding]:
    if not present:
        yield Finding("error", "HeadNode", "the HeadNode section is missing", "add HeadNode with InstanceType, Networking.SubnetId and Ssh.KeyName")
        return
    itype = head.get("InstanceType")
    if itype is None:
        yield Finding("error", "HeadNode.InstanceType", "the head node instance type is missing", "add HeadNode.InstanceType, e.g. c6i.4xlarge")
    elif not isinstance(itype, str) or not INSTANCE_TYPE_RE.match(itype):
        yield Finding("error", "HeadNode.InstanceType", f"{itype!r} is not an EC2 instance type name", "use a name like c6i.4xlarge")
    else:
        yield from _head_sizing(itype, cat, total_nodes)
    if not _d(head.get("Networking")).get("SubnetId"):
        yield Finding("error", "HeadNode.Networking.SubnetId", "the head node subnet is missing",
                      "set it to a public subnet id (the infra stack's PublicSubnetId output)")
    if not _d(head.get("Ssh")).get("KeyName"):
        yield Finding("error", "HeadNode.Ssh.KeyName", "no key pair is set for the head node",
                      "set HeadNode.Ssh.KeyName to the name of an EC2 key pair in the region")


def recommended_head_vcpus(total_nodes: int) -> int:
    """vCPUs we recommend for slurmctld + clustermgtd + NFS exports for this many compute nodes."""
    if total_nodes > 1000:
        return 32
    if total_nodes > 250:
        return 16
    if total_nodes > 32:
        return 8
    return 2


def _head_sizing(itype: str, cat: InstanceCatalog, total_nodes: int) -> Iterator[Finding]:
    path = "HeadNode.InstanceType"
    facts = cat.get(itype)
    family = itype.split(".")[0]
    if family.startswith("t") and total_nodes > 16:
        yield Finding("warning", path, f"{itype} is burstable: CPU credits run out under slurmctld and NFS load with {total_nodes} compute nodes",
                      "use a fixed-performance type such as c6i.2xlarge or larger")
    if facts is None:
        return
    need = recommended_head_vcpus(total_nodes)
    if facts.vcpus < need:
        yield Finding("warning", path, f"{itype} has {facts.vcpus} vCPUs for up to {total_nodes} compute nodes (head node sizing)",
                      f"use at least {need} vCPUs, e.g. {'c6i.8xlarge' if need > 16 else 'c6i.4xlarge' if need > 8 else 'c6i.2xlarge'}")
    if facts.gpus:
        yield Finding("warning", path, f"{itype} has {facts.gpus} GPUs that the head node never uses", "use a CPU type such as c6i.4xlarge")


def _queues(config: dict, cat: InstanceCatalog, region: str | None) -> tuple[list[Finding], int]:
    out: list[Finding] = []
    total = 0
    queues = _l(_d(config.get("Scheduling")).get("SlurmQueues")) or _l(config.get("SlurmQueues"))
    base = "Scheduling.SlurmQueues" if "SlurmQueues" in _d(config.get("Scheduling")) else "SlurmQueues"
    seen: set[str] = set()
    for i, q in enumerate(queues):
        q = _d(q)
        name = q.get("Name")
        out += _name_rule(name, _p(base, i, "Name"), "queue")
        if name in seen:
            out.append(Finding("error", _p(base, i, "Name"), f"queue name {name!r} is used twice", "give each queue its own name"))
        seen.add(name)
        if not _l(_d(q.get("Networking")).get("SubnetIds")):
            out.append(Finding("error", _p(base, i, "Networking", "SubnetIds"), "the queue has no subnet",
                               "set SubnetIds to the private subnet id (the infra stack's PrivateSubnetId output)"))
        capacity_type = q.get("CapacityType", "ONDEMAND")
        placement = _d(_d(q.get("Networking")).get("PlacementGroup")).get("Enabled", False)
        resources = _l(q.get("ComputeResources"))
        if not resources:
            out.append(Finding("error", _p(base, i, "ComputeResources"), "the queue has no compute resources",
                               "add ComputeResources with Name, InstanceType, MinCount, MaxCount"))
        gpu_check = _d(_d(q.get("HealthChecks")).get("Gpu")).get("Enabled") is True
        cr_names: set[str] = set()
        for j, r in enumerate(resources):
            r = _d(r)
            rp = (base, i, "ComputeResources", j)
            out += _name_rule(r.get("Name"), _p(*rp, "Name"), "compute resource")
            if r.get("Name") in cr_names:
                out.append(Finding("error", _p(*rp, "Name"), f"compute resource name {r.get('Name')!r} is used twice in this queue", "rename one"))
            cr_names.add(r.get("Name"))
            out += _counts(r, rp)
            total += r.get("MaxCount", 10) if isinstance(r.get("MaxCount", 10), int) else 0
            types = [r["InstanceType"]] if isinstance(r.get("InstanceType"), str) else [
                _d(x).get("InstanceType") for x in _l(r.get("Instances"))]
            if not types:
                out.append(Finding("error", _p(*rp, "InstanceType"), "no instance type", "add InstanceType, e.g. p5e.48xlarge"))
            efa = _d(r.get("Efa")).get("Enabled") is True
            for itype in types:
                facts = cat.get(itype) if isinstance(itype, str) else None
                if facts is None:
                    out.append(Finding("error", _p(*rp, "InstanceType"), f"unknown instance type {itype!r}",
                                       f"use a known type ({', '.join(cat.suggest(str(itype)))}) or add it to clustertrain/plan/instances.yaml"))
                    continue
                if region and cat.offered(itype, region) is False:
                    out.append(Finding("error", _p(*rp, "InstanceType"), f"{itype} is not offered in {region}",
                                       f"use one of its regions ({', '.join(facts.regions or ())}) or another type"))
                if efa and not facts.efa:
                    out.append(Finding("error", _p(*rp, "Efa", "Enabled"), f"{itype} does not support EFA",
                                       "set Efa.Enabled: false or use an EFA instance type (e.g. p5e.48xlarge, c6i.32xlarge)"))
                if not efa and facts.efa and facts.gpus:
                    out.append(Finding("warning", _p(*rp, "Efa", "Enabled"), f"{itype} supports EFA but it is not enabled; NCCL falls back to TCP sockets",
                                       "set Efa.Enabled: true"))
                if gpu_check and facts.gpus == 0:
                    out.append(Finding("error", _p(base, i, "HealthChecks", "Gpu", "Enabled"),
                                       f"GPU health checks are on but {itype} has no NVIDIA GPU", "set HealthChecks.Gpu.Enabled: false for this queue"))
            crt = _d(r.get("CapacityReservationTarget")) or _d(q.get("CapacityReservationTarget"))
            reserved = bool(crt) or capacity_type == "CAPACITY_BLOCK"
            out += _placement(efa, placement, reserved, capacity_type, _p(base, i, "Networking", "PlacementGroup", "Enabled"))
            if crt and capacity_type == "SPOT":
                out.append(Finding("error", _p(*rp, "CapacityReservationTarget"), "a capacity reservation cannot be targeted by a SPOT queue",
                                   "set the queue's CapacityType: ONDEMAND (ODCR) or CAPACITY_BLOCK"))
            if capacity_type == "CAPACITY_BLOCK" and not crt:
                out.append(Finding("error", _p(*rp, "CapacityReservationTarget"), "CAPACITY_BLOCK queues must target the Capacity Block",
                                   "add CapacityReservationTarget.CapacityReservationId: cr-..."))
    return out, total


def _placement(efa: bool, placement: bool, reserved: bool, capacity_type: str, path: str) -> Iterator[Finding]:
    """Reserved capacity (a targeted ODCR or a Capacity Block) and cluster placement groups pull opposite ways.

    ParallelCluster 3.16.1: ``PlacementGroupCapacityReservationValidator`` warns that a placement group beside an
    open or targeted ODCR "may" fail with insufficient capacity (it needs AWS to run, so we say it here), and
    ``PlacementGroupCapacityTypeValidator`` warns for a Capacity Block. awsome-distributed-training's
    cluster-vanilla.yaml: "set this to false if using a targeted ODCR". EC2: a Capacity Block needs no placement group.
    """
    if reserved and placement:
        what = "a Capacity Block" if capacity_type == "CAPACITY_BLOCK" else "a targeted capacity reservation (ODCR)"
        yield Finding("warning", path, f"a cluster placement group beside {what}: launches may fail with insufficient capacity "
                      "although the reservation has room (ParallelCluster's placement-group/capacity-reservation check)",
                      "set Networking.PlacementGroup.Enabled: false (the reservation already fixes where the nodes are)")
    elif efa and not placement and not reserved:
        yield Finding("warning", path, "EFA nodes without a cluster placement group get higher, uneven latency",
                      "set Networking.PlacementGroup.Enabled: true (not needed with a capacity reservation or Capacity Block)")


def _name_rule(name: Any, path: str, what: str) -> Iterator[Finding]:
    if not isinstance(name, str):
        yield Finding("error", path, f"the {what} has no Name", "add a Name (lowercase letters, digits, '-', at most 25)")
        return
    if not QUEUE_NAME_RE.match(name) or name == "default":
        yield Finding("error", path, f"{what} name {name!r} is not allowed",
                      "use 1-25 lowercase letters, digits and '-', starting with a letter, not 'default' (e.g. "
                      f"{re.sub(r'[^a-z0-9-]', '-', name.lower()).strip('-')[:25] or 'gpu'})")


def _counts(r: dict, rp: tuple) -> Iterator[Finding]:
    lo, hi = r.get("MinCount", 0), r.get("MaxCount", 10)
    for key, v, least in (("MinCount", lo, 0), ("MaxCount", hi, 1)):
        if not isinstance(v, int) or isinstance(v, bool) or v < least:
            yield Finding("error", _p(*rp, key), f"{key} must be an integer >= {least}, got {v!r}", f"set {key} to {least} or more")
    if isinstance(lo, int) and isinstance(hi, int) and lo > hi:
        yield Finding("error", _p(*rp, "MaxCount"), f"MinCount ({lo}) is greater than MaxCount ({hi})",
                      f"raise MaxCount to at least {lo} or lower MinCount to {hi}")


def _shared_storage(storage: list) -> Iterator[Finding]:
    mounts: dict[str, int] = {}
    names: dict[str, int] = {}
    for i, s in enumerate(storage):
        s = _d(s)
        mount = s.get("MountDir")
        if not isinstance(mount, str) or not mount.startswith("/"):
            yield Finding("error", _p("SharedStorage", i, "MountDir"), f"MountDir {mount!r} is not an absolute path", "use e.g. /fsx/data")
        elif mount.rstrip("/") in RESERVED_MOUNTS:
            yield Finding("error", _p("SharedStorage", i, "MountDir"), f"MountDir {mount} is a system or node-local directory", "use e.g. /fsx/data")
        elif mount.rstrip("/") in mounts:
            yield Finding("error", _p("SharedStorage", i, "MountDir"), f"MountDir {mount} is already used by SharedStorage[{mounts[mount.rstrip('/')]}]",
                          "give each file system its own mount dir")
        if isinstance(mount, str):
            mounts.setdefault(mount.rstrip("/"), i)
        name = s.get("Name")
        if name in names:
            yield Finding("error", _p("SharedStorage", i, "Name"), f"storage name {name!r} is already used by SharedStorage[{names[name]}]", "rename one")
        names.setdefault(name, i)
        if s.get("StorageType") == "FsxLustre":
            yield from _fsx(_d(s.get("FsxLustreSettings")), ("SharedStorage", i, "FsxLustreSettings"))


def _fsx(fs: dict, base: tuple) -> Iterator[Finding]:
    if fs.get("FileSystemId"):
        return
    dep = fs.get("DeploymentType", "SCRATCH_2")
    if dep not in FSX_DEPLOYMENT_TYPES:
        fix = "use PERSISTENT_2 (SSD, 125-1000 MB/s/TiB) or PERSISTENT_1" if str(dep).startswith("PERSISTENT") else f"use one of {', '.join(FSX_DEPLOYMENT_TYPES)}"
        yield Finding("error", _p(*base, "DeploymentType"), f"{dep!r} is not an FSx for Lustre deployment type", fix)
        return
    tput = fs.get("PerUnitStorageThroughput")
    problem = fsx_throughput_problem(dep, tput)
    if problem:
        yield Finding("error", _p(*base, "PerUnitStorageThroughput"), problem.split(": choose")[0].split("; ")[0],
                      _fix_from(problem, "set a valid PerUnitStorageThroughput"))
    cap = fs.get("StorageCapacity")
    if cap is None:
        yield Finding("error", _p(*base, "StorageCapacity"), "StorageCapacity is missing", "add StorageCapacity in GiB, e.g. 1200 or 2400")
    elif isinstance(cap, int):
        problem = fsx_capacity_problem(dep, cap, tput if isinstance(tput, int) else None)
        if problem:
            head, _, rule = problem.partition(": use ")
            yield Finding("error", _p(*base, "StorageCapacity"), head, f"use {rule}" if rule else "use a valid capacity")


def _fix_from(problem: str, default: str) -> str:
    for marker in (": choose ", "; "):
        if marker in problem:
            return problem.split(marker, 1)[1].strip()
    return default


def _values(node: Any, path: tuple = ()) -> Iterator[Finding]:
    """Placeholders left from examples, and secrets that must never be in a config file."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _values(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _values(v, path + (i,))
    elif isinstance(node, str):
        if SECRET_RE.search(node):
            yield Finding("error", _p(*path), "this value looks like an AWS access key or private key",
                          "remove it: credentials come from the instance role, keys stay out of config files")
        elif PLACEHOLDER_RE.search(node):
            yield Finding("error", _p(*path), f"{node!r} is a placeholder, not a real value", "replace it with the real id or name")
        elif DOC_ID_RE.search(node):
            yield Finding("error", _p(*path), f"{node!r} {DOC_ID_MESSAGE}",
                          "replace it with your own id (those of subnets, security groups and the node policy: "
                          "`clustertrain cluster infra deploy PROJECT` records them)")
