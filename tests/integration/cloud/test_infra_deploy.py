"""`clustertrain cluster infra deploy | status | delete` against moto's CloudFormation server over HTTP (boto3 reads
``AWS_ENDPOINT_URL``), with the flagship's infrastructure: 32 resources (three FSx for Lustre file systems among them),
created, updated and deleted through change
sets. The server is moto's own with the fixes of tests/support/moto_cfn.py (outputs after a change set, the delete of
route tables and friends) — what real CloudFormation does there.

What moto cannot say, real CloudFormation's ``Replacement`` per change, comes from clustertrain's prediction
(provider schemas' create-only properties; tests/unit/cloud/test_changeset.py also feeds recorded AWS output).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import boto3
import pytest
import yaml
from typer.testing import CliRunner

from clustertrain.cli.cluster import app
from clustertrain.check import run_check
from clustertrain.resolve import load_project
from tests.support.s3server import DUMMY_ENV
from tests.unit.cloud.conftest import example_raw

REGION = "ap-southeast-3"
STACK_FIELDS = ["public_subnet_id", "private_subnet_id", "head_security_group_id", "compute_security_group_id"]
runner = CliRunner()


ACCOUNT = "482913650271"  # moto's default account, 123456789012, is the AWS documentation's: check rightly refuses it


@pytest.fixture(scope="module")
def cfn_endpoint():
    """The module's server (tests/support/moto_cfn.py), in an account whose ARNs are not documentation examples."""
    from tests.support.moto_cfn import cfn_server
    from tests.support.s3server import dummy_environ

    with dummy_environ(MOTO_ACCOUNT_ID=ACCOUNT), cfn_server() as endpoint:
        yield endpoint


@pytest.fixture
def aws_env(cfn_endpoint, monkeypatch):
    for k in [k for k in list(os.environ) if k.startswith("AWS_")]:
        monkeypatch.delenv(k)
    for k, v in {**DUMMY_ENV, "AWS_ENDPOINT_URL": cfn_endpoint, "AWS_CONFIG_FILE": "/dev/null",
                 "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"}.items():
        monkeypatch.setenv(k, v)
    return cfn_endpoint


def flagship(tmp_path, name: str, **network) -> "Path":
    """The flagship with the infrastructure's ids left out (they come from the deploy), its own name and buckets."""
    raw = example_raw()
    raw["name"] = name
    aws = raw["aws"]
    for k in STACK_FIELDS:
        aws["network"].pop(k, None)
    aws["network"].update(network)
    aws.pop("storage_policy_arn", None)
    aws["example_ids"] = False  # every id is a deployed one now; the ODCR is the user's own
    aws["queues"][0]["capacity_reservation_id"] = "cr-05e8a2c6f1b9d7340"
    aws["buckets"] = {"data": f"{name}-data-482913650271", "checkpoints": f"{name}-ckpt-482913650271"}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def cli(*args, input=None):
    result = runner.invoke(app, [str(a) for a in args], input=input)
    return result.exit_code, result.output


def deploy(path, *extra):
    return cli("infra", "deploy", path, "--poll", "0.05", *extra)


def test_deploy_records_outputs_that_fill_the_cluster_config(aws_env, tmp_path):
    path = flagship(tmp_path, "flag-a")
    code, out = deploy(path, "--dry-run")
    assert code == 0 and "32 change(s)" in out and "nothing deployed" in out
    cf = boto3.client("cloudformation", region_name=REGION)
    assert not [s for s in cf.list_stacks()["StackSummaries"] if s["StackName"] == "flag-a-infra" and s["StackStatus"] != "DELETE_COMPLETE"]

    code, out = deploy(path)
    assert code == 0, out
    state = json.loads((tmp_path / "flag-a.infra.json").read_text())
    assert state["stack_name"] == "flag-a-infra" and state["region"] == REGION and state["status"] == "CREATE_COMPLETE"
    ec2 = boto3.client("ec2", region_name=REGION)
    subnets = {s["SubnetId"]: s["CidrBlock"] for s in ec2.describe_subnets()["Subnets"]}
    assert subnets[state["outputs"]["PrivateSubnetId"]] == "10.0.64.0/18" and subnets[state["outputs"]["PublicSubnetId"]] == "10.0.0.0/24"
    assert re.fullmatch(r"sg-[0-9a-f]+", state["outputs"]["ComputeSecurityGroupId"])
    assert state["outputs"]["StoragePolicyArn"].startswith(f"arn:aws:iam::{ACCOUNT}:policy/")
    assert sorted(state["retained"]) == ["CheckpointBucket", "DataBucket", "FsxCheckpoints", "FsxData", "FsxLogs"]
    fsx = {f["FileSystemId"]: f for f in boto3.client("fsx", region_name=REGION).describe_file_systems()["FileSystems"]}
    data = fsx[state["outputs"]["FsxDataId"]]
    assert (data["StorageCapacity"], data["LustreConfiguration"]["DeploymentType"], data["SubnetIds"]) == (
        7200, "PERSISTENT_2", [state["outputs"]["PrivateSubnetId"]])

    project = load_project(path)
    assert [f for _, f in run_check(project, only=["cluster"]).errors] == []
    code, out = cli("config", path, "-o", tmp_path / "cluster.yaml")
    assert code == 0, out
    config = yaml.safe_load((tmp_path / "cluster.yaml").read_text())
    assert config["HeadNode"]["Networking"]["SubnetId"] == state["outputs"]["PublicSubnetId"]
    queue = config["Scheduling"]["SlurmQueues"][0]["Networking"]
    assert queue["SubnetIds"] == [state["outputs"]["PrivateSubnetId"]]
    assert queue["AdditionalSecurityGroups"] == [state["outputs"]["ComputeSecurityGroupId"]]
    assert state["outputs"]["StoragePolicyArn"] in json.dumps(config["HeadNode"])
    assert {s["Name"]: s["FsxLustreSettings"] for s in config["SharedStorage"]} == {  # all three mounted by id, none new
        n: {"FileSystemId": state["outputs"][o]} for n, o in
        (("fsx-data", "FsxDataId"), ("fsx-checkpoints", "FsxCheckpointsId"), ("fsx-logs", "FsxLogsId"))}
    assert "0123456789abcdef0" not in (tmp_path / "cluster.yaml").read_text()  # no documentation id is left

    code, out = deploy(path)  # again: nothing to change
    assert code == 0 and "up to date" in out
    code, out = cli("infra", "status", path)
    assert code == 0 and "CREATE_COMPLETE" in out and "matches the project" in out and "aws.network.public_subnet_id" in out


def test_an_update_shows_and_applies_only_the_affected_resources(aws_env, tmp_path):
    """A new SSH CIDR: only the head node's security group changes, in place. (A subnet CIDR replaces more: the private
    subnet holds the file systems, refused below; the public one holds the NAT gateway, whose replacement keeps the
    same Elastic IP and fails with Resource.AlreadyAssociated, on moto as on AWS.)"""
    path = flagship(tmp_path, "flag-b")
    assert deploy(path)[0] == 0
    before = json.loads((tmp_path / "flag-b.infra.json").read_text())["outputs"]
    moved = flagship(tmp_path, "flag-b", ssh_cidr="198.51.100.0/24")
    code, out = cli("infra", "status", moved)
    assert "a deploy would make 1 change(s)" in out and "modify   HeadNodeSecurityGroup " in out, out
    code, out = deploy(moved)
    assert code == 0, out
    listed = re.findall(r"^  (add|modify|replace|remove)\s+(\w+)", out, re.M)
    # the group, and what refers to it (a change set lists those as possibly modified, evaluated when it runs)
    assert listed[0] == ("modify", "HeadNodeSecurityGroup") and {a for a, _ in listed} == {"modify"}, out
    after = json.loads((tmp_path / "flag-b.infra.json").read_text())
    assert after["status"] == "UPDATE_COMPLETE" and after["outputs"] == before  # same group, same ids
    ec2 = boto3.client("ec2", region_name=REGION)
    [group] = ec2.describe_security_groups(GroupIds=[before["HeadNodeSecurityGroupId"]])["SecurityGroups"]
    assert [r["CidrIp"] for p in group["IpPermissions"] for r in p.get("IpRanges", [])] == ["198.51.100.0/24"]


def test_replacing_the_vpc_or_a_bucket_is_refused_and_nothing_is_deployed(aws_env, tmp_path):
    path = flagship(tmp_path, "flag-c")
    assert deploy(path)[0] == 0
    state = (tmp_path / "flag-c.infra.json").read_text()
    cf = boto3.client("cloudformation", region_name=REGION)
    template = cf.get_template(StackName="flag-c-infra")["TemplateBody"]
    moved = flagship(tmp_path, "flag-c", vpc_cidr="10.1.0.0/16", public_subnet_cidr="10.1.0.0/24", private_subnet_cidr="10.1.64.0/18")
    code, out = deploy(moved)
    assert code == 2 and "deploy refused" in out and "Vpc (CidrBlock changed)" in out and "--allow-replace" in out
    code, out = deploy(flagship(tmp_path, "flag-c", private_subnet_cidr="10.0.128.0/18"))
    assert code == 2 and "the FSx file system FsxData (it follows the new PrivateSubnet)" in out, out
    code, out = cli("infra", "deploy", flagship(tmp_path, "flag-c"), "--set", "aws.fsx.2.capacity_gb=2400")
    assert code == 2 and "shrinks the FSx file system FsxLogs from 4800 to 2400 GiB" in out and "only grows" in out, out
    raw = yaml.safe_load(path.read_text())
    raw["aws"]["buckets"]["data"] = "flag-c-data2-482913650271"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    code, out = deploy(path)
    assert code == 2 and "S3 bucket DataBucket (BucketName changed)" in out.replace("s3 bucket", "S3 bucket")
    assert cf.get_template(StackName="flag-c-infra")["TemplateBody"] == template
    assert (tmp_path / "flag-c.infra.json").read_text() == state
    pending = [c for c in cf.list_change_sets(StackName="flag-c-infra")["Summaries"]
               if c["StackName"] == "flag-c-infra" and c.get("ExecutionStatus") != "EXECUTE_COMPLETE"]
    assert pending == []


def test_bad_input_is_one_line_and_deploys_nothing(aws_env, tmp_path):
    no_aws = tmp_path / "plain.yaml"
    raw = example_raw()
    raw.pop("aws")
    no_aws.write_text(yaml.safe_dump(raw))
    code, out = deploy(no_aws)
    assert code == 2 and "has no `aws:` section" in out

    # a stack in progress: a change set created and never executed (REVIEW_IN_PROGRESS)
    path = flagship(tmp_path, "flag-d")
    cf = boto3.client("cloudformation", region_name=REGION)
    cf.create_change_set(StackName="flag-d-infra", ChangeSetName="by-hand", ChangeSetType="CREATE",
                         TemplateBody=json.dumps({"Resources": {"T": {"Type": "AWS::SNS::Topic"}}}),
                         Tags=[{"Key": "clustertrain:project", "Value": "flag-d"}])
    code, out = deploy(path)
    assert code == 2 and "REVIEW_IN_PROGRESS" in out and "infra delete" in out
    code, out = cli("infra", "delete", path, "--yes", "--poll", "0.05")
    assert code == 0, out

    # someone else's stack of the same name
    path = flagship(tmp_path, "flag-e")
    cf.create_stack(StackName="flag-e-infra", TemplateBody=json.dumps({"Resources": {"T": {"Type": "AWS::SNS::Topic"}}}))
    code, out = deploy(path)
    assert code == 2 and "was not created for project 'flag-e'" in out

    # a state file of another region
    path = flagship(tmp_path, "flag-f")
    assert deploy(path)[0] == 0
    code, out = deploy(path, "--set", "aws.region=us-east-1", "--set", "aws.availability_zone=us-east-1a")
    assert code == 2 and "region mismatch" in out and "nothing was deployed" in out
    assert len(out.strip().splitlines()) == 1


def test_delete_keeps_the_buckets_and_removes_the_rest(aws_env, tmp_path):
    """The file systems must go first (their interfaces hold the private subnet: the server refuses that subnet's
    delete with DependencyViolation, as EC2 does): a delete refuses while they exist, --delete-file-systems deletes them."""
    path = flagship(tmp_path, "flag-g")
    assert deploy(path)[0] == 0
    outputs = json.loads((tmp_path / "flag-g.infra.json").read_text())["outputs"]
    fsx = boto3.client("fsx", region_name=REGION)
    code, out = cli("infra", "delete", path, "--yes", "--poll", "0.05")
    assert code == 2 and out.count("\n") == 1 and "still has its FSx file systems FsxData " in out, out
    assert f"`clustertrain cluster infra delete {path} --delete-file-systems`" in out and "nothing was deleted" in out
    assert len(fsx.describe_file_systems()["FileSystems"]) >= 3 and (tmp_path / "flag-g.infra.json").exists()
    code, out = cli("infra", "delete", path, "--delete-file-systems", "--poll", "0.05", input="n\n")
    assert code == 1 and "retained: flag-g-data-482913650271 (AWS::S3::Bucket)" in out
    assert f"the FSx file systems {', '.join(sorted(outputs[k] for k in ('FsxDataId', 'FsxCheckpointsId', 'FsxLogsId')))} " \
           "and their data first" in out
    code, out = cli("infra", "delete", path, "--yes", "--delete-file-systems", "--poll", "0.05")
    assert code == 0, out
    assert f"deleting FSx {outputs['FsxDataId']} (FsxData)" in out and "deleted 3 FSx file system(s)" in out
    assert "retained AWS::S3::Bucket flag-g-ckpt-482913650271" in out and not (tmp_path / "flag-g.infra.json").exists()
    assert "retained AWS::FSx" not in out
    for key in ("FsxDataId", "FsxCheckpointsId", "FsxLogsId"):
        with pytest.raises(fsx.exceptions.FileSystemNotFound):
            fsx.describe_file_systems(FileSystemIds=[outputs[key]])
    ec2 = boto3.client("ec2", region_name=REGION)
    assert outputs["VpcId"] not in {v["VpcId"] for v in ec2.describe_vpcs()["Vpcs"]}
    assert outputs["PrivateSubnetId"] not in {s["SubnetId"] for s in ec2.describe_subnets()["Subnets"]}
    s3 = boto3.client("s3", region_name=REGION)
    assert {"flag-g-data-482913650271", "flag-g-ckpt-482913650271"} <= {b["Name"] for b in s3.list_buckets()["Buckets"]}
    code, out = cli("infra", "delete", path, "--yes")
    assert code == 0 and "nothing to delete" in out


def test_a_failed_deploy_names_the_first_failed_resource_and_blocks_the_next(aws_env, tmp_path):
    path = flagship(tmp_path, "flag-h")
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket="flag-h-data-482913650271", CreateBucketConfiguration={"LocationConstraint": REGION})
    code, out = deploy(path)
    last = out.strip().splitlines()[-1]
    assert code == 2 and last.startswith("error: stack flag-h-infra is ROLLBACK_COMPLETE: DataBucket (AWS::S3::Bucket) CREATE_FAILED")
    assert "infra delete" in last and not (tmp_path / "flag-h.infra.json").exists()
    code, out = deploy(path)
    assert code == 2 and "is ROLLBACK_COMPLETE" in out and "delete it" in out
    assert cli("infra", "delete", path, "--yes", "--poll", "0.05")[0] == 0
