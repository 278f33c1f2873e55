"""`clustertrain cluster create | status | delete` running the REAL aws-parallelcluster 3.16.1 ``pcluster`` against moto's
server over HTTP (``AWS_ENDPOINT_URL``), after the flagship's infrastructure stack was deployed there by
``clustertrain.cloud.stack.deploy`` (VPC, subnets, security groups, buckets, IAM policy and the three FSx for Lustre
file systems; the server is tests/support/moto_cfn.py's, whose FSx are answered as AWS answers them) and the key pair
created by boto3: phase 1 feeds phase 2 as it does for a user.

What runs for real: the node-script upload (clustertrain's S3 store into moto's S3); ``pcluster create-cluster
--dryrun true``, i.e. pcluster's own config loading and validators calling EC2/IAM/S3/STS/FSx on moto, passing for the
flagship with its three file systems mounted by the ids the stack recorded (ExistingFsxNetworkingValidator: same VPC,
TCP 988 open from the nodes' groups; NumberOfStorageValidator: no new FSx), and stopping ``create`` for a key pair
that does not exist (KeyPairValidator) and for a file system that does not exist; ``describe-cluster`` and
``delete-cluster`` answering for a cluster that does not exist.

What moto cannot do, and how the test meets it (each confirmed on this server, see the moto source cited):
* EC2 DescribeCapacityReservations is not implemented (moto answers 500; pcluster's config loading calls it for any
  ``CapacityReservationTarget``): the project here targets no reservation.
* RunInstances with ``DryRun`` refuses pcluster's instance-store block device mappings (``VirtualName: ephemeralN``
  without ``Ebs``: moto/ec2/responses/instances.py ``_validate_block_device_mapping``, "The request must contain the
  parameter ebs"): HeadNodeLaunchTemplateValidator and ComputeResourceLaunchTemplateValidator are suppressed
  (``--suppress-validator``).
* moto's instance-type offerings for ap-southeast-3 have no c6i: the head node is a c5.2xlarge.
* a real ``create-cluster`` goes on to a CloudFormation stack (made by pcluster's CDK templates: launch templates,
  CloudWatch alarms and dashboards, a Lambda-backed custom resource...) that this server does not build, so
  describe-cluster never reaches CREATE_COMPLETE there. The full create is therefore run with the real dry run and upload, and the
  non-dry ``create-cluster`` and the ``describe-cluster`` polls answered by :data:`RECORDED` (real-format outputs,
  see tests/unit/cloud/test_lifecycle.py for their sources).

Server settings: ``MOTO_AMIS_PATH`` holds the official ParallelCluster AMI pcluster looks up by name
(``aws-parallelcluster-3.16.1-amzn2023-hvm-x86_64*``, owner amazon); ``MOTO_ACCOUNT_ID`` is not the documentation's
123456789012 (check refuses that account in the policy ARN); ``MOTO_IAM_LOAD_MANAGED_POLICIES`` loads AmazonSSMManagedInstanceCore. pcluster's log goes to a
temporary HOME.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from clustertrain.cli.cluster_lifecycle import register
from clustertrain.cli.common import command_group
from clustertrain.cloud.lifecycle import DRYRUN_OK, Pcluster, Reply, lifecycle
from clustertrain.resolve import load_project
from tests.unit.cloud.conftest import example_raw

pytestmark = pytest.mark.slow

REGION = "ap-southeast-3"
ACCOUNT = "482913650271"
BUCKET = "p5e-80x7-training-data-jakarta-482913650271"
MOTO_GAPS = ["HeadNodeLaunchTemplateValidator", "ComputeResourceLaunchTemplateValidator"]
AMI = {"ami_id": "ami-0a1b2c3d4e5f60718", "name": "aws-parallelcluster-3.16.1-amzn2023-hvm-x86_64-202601010000",
       "description": "AWS ParallelCluster AMI for amzn2023", "owner_id": "247102896272", "public": True,
       "virtualization_type": "hvm", "architecture": "x86_64", "state": "available", "platform": None,
       "image_type": "machine", "hypervisor": "xen", "root_device_name": "/dev/xvda", "root_device_type": "ebs",
       "sriov": "simple", "creation_date": "2026-01-01T00:00:00.000Z"}

app = command_group(help="test")
register(app)
runner = CliRunner()


@pytest.fixture(scope="module")
def aws(tmp_path_factory):
    """The server with the flagship's infrastructure stack deployed (the state file beside the project) and a key pair;
    the environment pointing at it."""
    import boto3

    from clustertrain.cloud.stack import deploy
    from tests.support.moto_cfn import cfn_server
    from tests.support.s3server import dummy_environ

    tmp = tmp_path_factory.mktemp("pcluster-moto")
    (tmp / "amis.json").write_text(json.dumps([AMI]))
    with dummy_environ(MOTO_AMIS_PATH=str(tmp / "amis.json"), MOTO_ACCOUNT_ID=ACCOUNT, AWS_DEFAULT_REGION=REGION,
                       MOTO_IAM_LOAD_MANAGED_POLICIES="true", HOME=str(tmp / "home")), cfn_server() as endpoint:
        os.environ["AWS_ENDPOINT_URL"] = endpoint  # restored by dummy_environ
        raw = example_raw()
        a = raw["aws"]
        for k in ("public_subnet_id", "private_subnet_id", "head_security_group_id", "compute_security_group_id"):
            a["network"].pop(k)  # from the deploy, as the file systems' ids
        a.pop("storage_policy_arn")
        a["example_ids"] = False
        a["buckets"] = {"data": f"p5e-80x7-data-{ACCOUNT}", "checkpoints": f"p5e-80x7-checkpoints-{ACCOUNT}"}
        # the stack's buckets deny plain HTTP (DenyInsecureTransport, enforced by moto): this server speaks only HTTP
        a["scripts_s3_uri"] = f"s3://{BUCKET}/clustertrain/node-scripts"
        a["head_node"]["instance_type"] = "c5.2xlarge"
        for q in a["queues"]:
            q.pop("capacity_reservation_id", None)
        base = tmp / "deployed"
        base.mkdir()
        (base / "p5e-80x7.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
        deploy(load_project(base / "p5e-80x7.yaml"), echo=lambda line: None, poll_s=0.05)
        boto3.client("ec2", region_name=REGION).create_key_pair(KeyName="p5e-cluster-key", KeyType="ed25519")  # pcluster reads KeyType
        s3 = boto3.client("s3", region_name=REGION)
        s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
        state = json.loads((base / "p5e-80x7.infra.json").read_text())
        yield {"tmp": tmp, "raw": raw, "state": state, "s3": s3, "cfn": boto3.client("cloudformation", region_name=REGION)}


def project_file(aws, name: str, edit=None) -> Path:
    """A copy of the deployed project (its state file beside it) in its own directory, edited."""
    raw = json.loads(json.dumps(aws["raw"]))
    if edit:
        edit(raw)
    d = aws["tmp"] / name
    d.mkdir()
    (d / "p5e-80x7.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    (d / "p5e-80x7.infra.json").write_text(json.dumps(aws["state"]))
    return d / "p5e-80x7.yaml"


def suppress_args() -> list[str]:
    return [a for v in MOTO_GAPS for a in ("--suppress-validator", v)]


class RealDryRun:
    """Real pcluster for ``--dryrun true``, describe of a missing cluster and the like; :data:`RECORDED` answers the
    non-dry create-cluster and the describe-cluster polls, which moto cannot reach (see the module docstring)."""

    def __init__(self, recorded: dict[str, list[dict]]) -> None:
        self.real, self.recorded, self.calls = Pcluster(), recorded, []

    def __call__(self, argv):
        self.calls.append(tuple(argv))
        if "--dryrun" in argv or argv[1] not in self.recorded:
            reply = self.real(argv)
            self.calls[-1] = (*argv, f"-> real rc {reply.rc}: {reply.message[:60]}")
            return reply
        rc, data = self.recorded[argv[1]].pop(0)
        return Reply(tuple(argv), rc, data)


def _describe(status: str, stack: str, fleet: str, head: dict | None = None) -> tuple[int, dict]:
    d = {"clusterName": "p5e-80x7", "region": REGION, "version": "3.16.1", "clusterStatus": status,
         "cloudFormationStackStatus": stack, "computeFleetStatus": fleet, "creationTime": "2026-11-23T10:00:00.000Z",
         "lastUpdatedTime": "2026-11-23T10:00:00.000Z", "clusterConfiguration": {"url": "NOT_AVAILABLE"},
         "cloudformationStackArn": f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/p5e-80x7/0a1b", "tags": [],
         "scheduler": {"type": "slurm"}}
    if head:
        d["headNode"] = head
    return 0, d


def test_create_uploads_the_scripts_and_passes_pclusters_real_dry_run(aws):
    path = project_file(aws, "good")
    head = {"instanceId": "i-0f1e2d3c4b5a69788", "instanceType": "c5.2xlarge", "state": "running",
            "launchTime": "2026-11-23T10:05:00.000Z", "publicIpAddress": "198.51.100.44", "privateIpAddress": "10.0.0.12"}
    recorded = {
        "create-cluster": [(0, {"cluster": {"clusterName": "p5e-80x7", "cloudformationStackStatus": "CREATE_IN_PROGRESS",
                                            "cloudformationStackArn": f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/p5e-80x7/0a1b",
                                            "region": REGION, "version": "3.16.1", "clusterStatus": "CREATE_IN_PROGRESS",
                                            "scheduler": {"type": "slurm"}}})],
        "describe-cluster": [_describe("CREATE_IN_PROGRESS", "CREATE_IN_PROGRESS", "UNKNOWN"),
                             _describe("CREATE_COMPLETE", "CREATE_COMPLETE", "RUNNING", head)],
    }
    run, said = RealDryRun(recorded), []
    lifecycle("create", load_project(path), suppress=MOTO_GAPS, say=said.append, poll_s=0, run=run)
    dry = [c for c in run.calls if "--dryrun" in c]
    assert len(dry) == 1 and dry[0][-1].startswith(f"-> real rc 1: {DRYRUN_OK[:40]}"), run.calls
    assert dry[0][:10] == ("pcluster", "create-cluster", "--cluster-name", "p5e-80x7", "--cluster-configuration",
                           str(path.with_name("p5e-80x7.cluster.yaml")), "--region", REGION, "--dryrun", "true")
    assert [c[1] for c in run.calls] == ["create-cluster", "create-cluster", "describe-cluster", "describe-cluster"]
    listed = aws["s3"].list_objects_v2(Bucket=BUCKET, Prefix="clustertrain/node-scripts/")["Contents"]
    uploaded = {o["Key"].rsplit("/", 1)[1] for o in listed}
    assert uploaded == {p.name for p in path.with_name("p5e-80x7.node-scripts").iterdir()} == {
        "head-node.sh", "compute-node.sh", "setup-dirs.sh"}
    body = aws["s3"].get_object(Bucket=BUCKET, Key="clustertrain/node-scripts/head-node.sh")["Body"].read()
    assert body == path.with_name("p5e-80x7.node-scripts").joinpath("head-node.sh").read_bytes()
    config = yaml.safe_load(path.with_name("p5e-80x7.cluster.yaml").read_text())
    assert config["HeadNode"]["Ssh"] == {"KeyName": "p5e-cluster-key", "AllowedIps": "203.0.113.0/24"}
    outputs = aws["state"]["outputs"]  # the three file systems the stack made, mounted by id: none new for pcluster
    assert [s["FsxLustreSettings"] for s in config["SharedStorage"]] == [
        {"FileSystemId": outputs[k]} for k in ("FsxDataId", "FsxCheckpointsId", "FsxLogsId")]
    assert any("DetailedMonitoringValidator" in s for s in said), said  # pcluster's own warning, printed
    assert any("198.51.100.44" in s for s in said) and any(s.startswith("log in: pcluster ssh") for s in said), said


def test_a_key_pair_that_does_not_exist_stops_create_before_anything_is_created(aws):
    path = project_file(aws, "badkey", lambda raw: raw["aws"]["head_node"].update(key_name="no-such-key"))
    r = runner.invoke(app, ["create", str(path), "--poll-interval", "0", *suppress_args()])
    assert r.exit_code == 2, r.output
    *done, error = r.output.strip().splitlines()
    assert error == ("error: pcluster create-cluster rejected the config: KeyPairValidator: "
                     "The keypair '{'no-such-key'}' does not exist; nothing was created"), r.output
    assert [line.split()[0] for line in done] == ["wrote", "uploaded"]  # the config and the scripts, nothing else
    assert [x["StackName"] for x in aws["cfn"].list_stacks()["StackSummaries"]] == ["p5e-80x7-infra"]  # create-cluster never ran
    assert not [b for b in aws["s3"].list_buckets()["Buckets"] if b["Name"].startswith("parallelcluster-")]


def test_a_file_system_that_does_not_exist_stops_create_before_anything_is_created(aws):
    """pcluster describes every mounted file system while it loads the config (then ExistingFsxNetworkingValidator
    checks its VPC and that its security groups let the nodes in on TCP 988): an id FSx does not know stops create."""
    path = project_file(aws, "nofs", lambda raw: raw["aws"]["fsx"][2].update(file_system_id="fs-0a0b0c0d0e0f01234"))
    r = runner.invoke(app, ["create", str(path), *suppress_args()])
    assert r.exit_code == 2, r.output
    assert r.output.strip().splitlines()[-1] == ("error: pcluster create-cluster: Invalid cluster configuration: File system "
                                                 "'fs-0a0b0c0d0e0f01234' does not exist; nothing was created"), r.output
    assert aws["cfn"].list_stacks()["StackSummaries"][0]["StackName"] == "p5e-80x7-infra"  # the infra stack only


def test_status_and_delete_of_a_cluster_that_does_not_exist(aws):
    path = project_file(aws, "absent")
    r = runner.invoke(app, ["status", str(path)])
    assert r.exit_code == 2
    assert r.output == f"error: cluster p5e-80x7 does not exist in {REGION}; create it: clustertrain cluster create {path}\n"
    r = runner.invoke(app, ["delete", str(path), "--yes"])
    assert r.exit_code == 0, r.output
    assert r.output == f"cluster p5e-80x7 does not exist in {REGION}: nothing to delete\n"
