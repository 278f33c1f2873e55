"""Checks on a project's ``aws:`` section that need the instance catalog or several sections, as findings.

Each finding names the project-file field and the fix. :func:`project_findings` never raises for a
user mistake; :func:`clustertrain.cloud.pcluster.check_project_aws` raises the first error (for the
commands that build a config). Also here: where the buckets and node scripts are, derived once.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from clustertrain.cloud.catalog import InstanceCatalog, load_catalog
from clustertrain.cloud.config import OS_DEFAULT_USER, AwsConfig
from clustertrain.cloud.state import deployed_fsx_id, fsx_output, project_state_path, state_findings
from clustertrain.core.errors import ConfigError
from clustertrain.core.findings import Finding

if TYPE_CHECKING:
    from clustertrain.project import Project


def require_aws(project: "Project") -> AwsConfig:
    if project.aws is None:
        raise ConfigError(f"project {project.name!r} has no `aws:` section; add one (see docs/cloud.md and examples/p5e-80x7.yaml)")
    return project.aws


def bucket_of(uri: str | None) -> str | None:
    """`s3://bucket/prefix` -> `bucket`; None for anything that is not an s3:// URI."""
    if not uri or not uri.startswith("s3://"):
        return None
    return uri[5:].split("/", 1)[0] or None


def prefix_of(uri: str | None) -> str:
    """`s3://bucket/a/b/` -> `a/b` ('' for the bucket root)."""
    if not uri or not uri.startswith("s3://"):
        return ""
    parts = uri[5:].split("/", 1)
    return parts[1].strip("/") if len(parts) > 1 else ""


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


def bucket_name_problem(name: str, project_name: str) -> str | None:
    """Why a bucket name is very likely owned by someone else already, or None.

    S3 bucket names are global across every AWS account. A name made only of common words
    (`checkpoint-jakarta`, `training-data`) is almost surely taken: CreateBucket fails with
    BucketAlreadyExists and the infra stack rolls back. A name is considered unique enough when it
    contains the project name, or a run of at least 6 digits (an account id, a date), or a token of
    8+ characters that mixes letters and digits (a random suffix). We warn instead of adding a suffix
    ourselves: the account id is not known offline, a random suffix would change on every run, and
    the user may already own the bucket."""
    slug = re.sub(r"[^a-z0-9]+", "-", project_name.lower()).strip("-")
    tokens = re.split(r"[.-]", name)
    if (slug and slug in name) or re.search(r"\d{6,}", name) or any(
            len(t) >= 8 and re.search(r"\d", t) and re.search(r"[a-z]", t) for t in tokens):
        return None
    return (f"bucket name {name!r} is made of common words; S3 names are global across all accounts, so it is very likely "
            "taken (CreateBucket fails with BucketAlreadyExists and the infra stack rolls back)")


def deploy_fix(project: "Project", output: str = "") -> str:
    """How an id of the infrastructure stack gets into the project: the deploy command with this project's file."""
    import shlex

    cmd = shlex.join(["clustertrain", "cluster", "infra", "deploy", str(project.file) if project.file else "PROJECT"])
    where = f", recorded in {project_state_path(project)}," if project_state_path(project) else ""
    return f"run `{cmd}`: the stack's {output + ' ' if output else ''}output{where} fills it"


def reservation_findings(aws: AwsConfig) -> list[Finding]:
    """``min_count`` below ``max_count`` on a queue that targets an On-Demand Capacity Reservation: the reserved
    instances are paid for whether they run or not, and the dynamic ones are launched (and boot through the node
    scripts) for each job and stopped when idle. awsome-distributed-training's ParallelCluster templates keep
    MinCount = MaxCount for reserved capacity (``1.architectures/2.aws-parallelcluster/deployment-guides/templates/
    cluster-vanilla.yaml``: "if min = max then capacity is maintained and will not scale down"; ../shared/facts.md).
    A Capacity Block with min < max is pcluster's own error (``ComputeResourceSizeValidator``), not repeated here."""
    out = []
    for i, q in enumerate(aws.queues):
        if q.capacity_type != "ONDEMAND" or not q.reserved or q.min_count is None or q.min_count >= q.max_count:
            continue
        dynamic = q.max_count - q.min_count
        out.append(Finding("warning", f"aws.queues[{i}].min_count",
                           f"{q.min_count} is below max_count ({q.max_count}) on the targeted capacity reservation "
                           f"{q.capacity_reservation_id}: its {q.max_count} instances are paid for anyway, and {dynamic} "
                           "of them become dynamic nodes that launch and boot for each job and stop when idle",
                           f"remove aws.queues[{i}].min_count (with a reservation it defaults to max_count, static "
                           f"nodes) or set it to {q.max_count}"))
    return out


def sharing_models(project: "Project") -> list[str]:
    """The models whose jobs run on a share of one node (``models[].plan.gpus`` below a node's,
    :meth:`clustertrain.project.Project.shares_node`), in file order."""
    return [m.name for m in project.models if project.shares_node(m)]


def memory_based_scheduling(project: "Project") -> bool:
    """``Scheduling.SlurmSettings.EnableMemoryBasedScheduling``: ``aws.memory_based_scheduling``, else on exactly when
    models share nodes. With it ParallelCluster's slurm.conf says ``SelectTypeParameters=CR_CPU_Memory`` (else
    ``CR_CPU``; cookbook ``aws-parallelcluster-slurm/files/default/head_node_slurm/slurm/templates/
    slurm_parallelcluster.conf``) and its cgroup.conf ``ConstrainRAMSpace=yes`` (``slurm_parallelcluster_cgroup.conf``):
    each job's ``--mem`` is reserved on the node and enforced."""
    aws = require_aws(project)
    if aws.memory_based_scheduling is not None:
        return aws.memory_based_scheduling
    return bool(sharing_models(project))


def sharing_queue(project: "Project", index: int) -> bool:
    """Queue ``aws.queues[index]`` runs jobs of models that share nodes: ``cluster.partition`` names it (every queue
    when no partition is named: a job then goes to Slurm's default partition)."""
    aws = require_aws(project)
    if not sharing_models(project):
        return False
    partition = project.cluster.partition
    return partition is None or aws.queues[index].name == partition


def queue_exclusive(project: "Project", index: int) -> bool:
    """``JobExclusiveAllocation`` of ``aws.queues[index]``: its explicit ``exclusive``, else false on a queue that runs
    shared-node jobs (:func:`sharing_queue`) and true elsewhere. Whole-node jobs stay whole-node on a non-exclusive
    queue: they ask ``--exclusive`` themselves (``launch.exclusive``)."""
    q = require_aws(project).queues[index]
    if q.exclusive is not None:
        return q.exclusive
    return not sharing_queue(project, index)


def sharing_findings(project: "Project") -> list[Finding]:
    """Models share nodes but the cluster cannot place shares side by side: memory-based scheduling turned off
    (``aws.memory_based_scheduling: false``), or the queue that runs them exclusive (``aws.queues[i].exclusive: true``)."""
    aws = require_aws(project)
    shared = sharing_models(project)
    if not shared:
        return []
    names = ", ".join(shared)
    out = []
    if aws.memory_based_scheduling is False:
        out.append(Finding("error", "aws.memory_based_scheduling",
                           f"false while models share nodes ({names}: models[].plan.gpus below a node's); Slurm would "
                           "not count their host memory and co-located jobs could exhaust a node's",
                           "remove aws.memory_based_scheduling (it defaults to on) or set it to true"))
    for i, q in enumerate(aws.queues):
        if q.exclusive and sharing_queue(project, i):
            out.append(Finding("error", f"aws.queues[{i}].exclusive",
                               f"true on queue {q.name!r}, which runs models that share nodes ({names}); "
                               "JobExclusiveAllocation would give each of their jobs a whole node",
                               "remove exclusive (whole-node jobs still ask --exclusive themselves, launch.exclusive) "
                               "or set it to false"))
    return out


def project_findings(project: "Project", catalog: InstanceCatalog | None = None) -> list[Finding]:
    """Every problem of the ``aws:`` section that the project model alone cannot see; [] without ``aws:``."""
    aws = project.aws
    if aws is None:
        return []
    cat = catalog or load_catalog()
    out: list[Finding] = list(state_findings(project))

    def err(path: str, message: str, fix: str) -> None:
        out.append(Finding("error", path, message, fix))

    if aws.region not in cat.regions:
        err("aws.region", f"{aws.region!r} is not an AWS region known to clustertrain", "use a region name such as ap-southeast-3 or us-east-1")
    for i, q in enumerate(aws.queues):
        facts = cat.get(q.instance_type)
        where = f"aws.queues[{i}].instance_type"
        if facts is None:
            err(where, f"unknown instance type {q.instance_type!r}",
                f"use a known type ({', '.join(cat.suggest(q.instance_type))}) or add it to clustertrain/plan/instances.yaml")
            continue
        if cat.offered(q.instance_type, aws.region) is False:
            err(where, f"{q.instance_type} is not offered in {aws.region}", f"use one of {', '.join(facts.regions or ())} or another type")
        if q.efa and not facts.efa:
            err(f"aws.queues[{i}].efa", f"{q.instance_type} does not support EFA", "remove efa or pick an EFA type (e.g. p5e.48xlarge)")
        if q.gpu_health_checks and facts.gpus == 0:
            err(f"aws.queues[{i}].gpu_health_checks", f"{q.instance_type} has no NVIDIA GPU", "set gpu_health_checks: false")
    out += reservation_findings(aws)
    out += sharing_findings(project)
    cl = project.cluster
    if cl.partition is not None:
        names = [q.name for q in aws.queues]
        if cl.partition not in names:
            err("cluster.partition", f"{cl.partition!r} is not one of aws.queues ({', '.join(names)})", "rename the queue or the partition")
        else:
            i = names.index(cl.partition)
            q = aws.queues[i]
            if cl.instance_type and cl.instance_type != q.instance_type:
                err("cluster.instance_type", f"{cl.instance_type} differs from aws.queues[{i}].instance_type {q.instance_type}",
                    "make them the same")
            if cl.nodes > q.max_count:
                err("cluster.nodes", f"{cl.nodes} nodes exceed aws.queues[{i}].max_count ({q.max_count})", "raise max_count or lower nodes")
    if aws.network.public_subnet_id is None:
        err("aws.network.public_subnet_id", "the head node subnet is missing", deploy_fix(project, "PublicSubnetId"))
    if aws.network.private_subnet_id is None:
        err("aws.network.private_subnet_id", "the compute/FSx subnet is missing", deploy_fix(project, "PrivateSubnetId"))
    for i, f in enumerate(aws.fsx):
        if f.file_system_id is None and deployed_fsx_id(project, f.name) is None:
            level, allowed = ("warning", " (allowed by aws.example_ids)") if aws.example_ids else ("error", "")
            out.append(Finding(level, f"aws.fsx[{i}].file_system_id",
                               f"{f.name} ({f.mount_dir}) is created by the infrastructure stack, which has not created it "
                               f"yet{allowed}", deploy_fix(project, fsx_output(f.name))))
    if aws.head_node.key_name is None:
        err("aws.head_node.key_name", "no EC2 key pair is named", "set it to the name of an EC2 key pair in the region (the name only)")
    try:
        scripts_uri(project)
    except ConfigError as e:
        err("aws.scripts_s3_uri", str(e).split(";")[0], "set aws.scripts_s3_uri or aws.buckets.data")
    if aws.storage_policy_arn is None:
        err("aws.storage_policy_arn", "no IAM policy gives the nodes S3 access (node scripts, datasets, checkpoint backups)",
            deploy_fix(project, "StoragePolicyArn"))
    for field, name in (("aws.buckets.data", data_bucket(project)), ("aws.buckets.checkpoints", checkpoint_bucket(project))):
        problem = name and bucket_name_problem(name, project.name)
        if problem:
            out.append(Finding("warning", field, problem, f"add a unique suffix, e.g. {name}-<account-id> or {project.name.lower()}-{name}"))
    return out
