"""The CloudFormation template: cfn-lint clean (errors and warnings), and the security properties
the issue asks for, read from the template itself."""

from __future__ import annotations

import re

import pytest
import yaml

from clustertrain.cloud import build_infra_template, render_infra_template
from clustertrain.core.errors import ConfigError


@pytest.fixture
def template(scenario) -> dict:
    return build_infra_template(scenario)


def _of_type(t: dict, kind: str) -> dict:
    return {k: v for k, v in t["Resources"].items() if v["Type"] == kind}


def test_cfn_lint_reports_nothing(scenario, template):
    cfnlint_api = pytest.importorskip("cfnlint.api")
    text = render_infra_template(template, scenario.name)
    matches = cfnlint_api.lint(text, regions=["ap-southeast-3"])
    assert [f"{m.rule.id} {m.message} (line {m.linenumber})" for m in matches] == []


def test_cfn_lint_would_catch_a_broken_template(scenario, template):
    """Guard against a vacuous lint: the same call flags a dangling Ref."""
    cfnlint_api = pytest.importorskip("cfnlint.api")
    template["Resources"]["PublicSubnet"]["Properties"]["VpcId"] = {"Ref": "NoSuchVpc"}
    matches = cfnlint_api.lint(render_infra_template(template, scenario.name), regions=["ap-southeast-3"])
    assert any(m.rule.id.startswith("E") for m in matches)


def test_network_layout(template):
    subnets = _of_type(template, "AWS::EC2::Subnet")
    assert {k: v["Properties"]["MapPublicIpOnLaunch"] for k, v in subnets.items()} == {"PublicSubnet": True, "PrivateSubnet": False}
    assert all(v["Properties"]["AvailabilityZone"] == {"Ref": "AvailabilityZone"} for v in subnets.values())
    assert template["Parameters"]["AvailabilityZone"]["Default"] == "ap-southeast-3a"
    routes = {k: v["Properties"] for k, v in _of_type(template, "AWS::EC2::Route").items()}
    assert routes["PublicDefaultRoute"]["GatewayId"] == {"Ref": "InternetGateway"}
    assert routes["PrivateDefaultRoute"]["NatGatewayId"] == {"Ref": "NatGateway"}
    assert template["Resources"]["NatGateway"]["Properties"]["SubnetId"] == {"Ref": "PublicSubnet"}


def test_ssh_only_from_the_configured_cidr_and_efa_within_compute(template):
    head = template["Resources"]["HeadNodeSecurityGroup"]["Properties"]["SecurityGroupIngress"]
    assert head == [{"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "CidrIp": "203.0.113.0/24",
                     "Description": "SSH from the configured CIDR only"}]
    ingress = {k: v["Properties"] for k, v in _of_type(template, "AWS::EC2::SecurityGroupIngress").items()}
    assert all("CidrIp" not in p for p in ingress.values()), "only security-group sources inside the VPC"
    pairs = {(p["GroupId"]["Fn::GetAtt"][0], p["SourceSecurityGroupId"]["Fn::GetAtt"][0], p["IpProtocol"]) for p in ingress.values()}
    assert pairs == {("ComputeSecurityGroup", "ComputeSecurityGroup", "-1"), ("ComputeSecurityGroup", "HeadNodeSecurityGroup", "-1"),
                     ("HeadNodeSecurityGroup", "ComputeSecurityGroup", "-1")}
    egress = template["Resources"]["ComputeToCompute"]["Properties"]
    assert egress["DestinationSecurityGroupId"] == {"Fn::GetAtt": ["ComputeSecurityGroup", "GroupId"]}


def test_no_ssh_ingress_without_a_cidr(make_project):
    t = build_infra_template(make_project(lambda r: r["aws"]["network"].pop("ssh_cidr")))
    assert t["Resources"]["HeadNodeSecurityGroup"]["Properties"]["SecurityGroupIngress"] == []


def test_buckets_are_private_encrypted_tls_only_and_checkpoints_versioned(template):
    buckets = _of_type(template, "AWS::S3::Bucket")
    assert {v["Properties"]["BucketName"] for v in buckets.values()} == {"training-data-jakarta", "checkpoint-jakarta"}
    for name, b in buckets.items():
        p = b["Properties"]
        assert all(p["PublicAccessBlockConfiguration"].values()) and len(p["PublicAccessBlockConfiguration"]) == 4
        assert p["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]["ServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"
        policy = template["Resources"][f"{name}Policy"]["Properties"]["PolicyDocument"]["Statement"]
        assert policy == [{"Sid": "DenyInsecureTransport", "Effect": "Deny", "Principal": "*", "Action": "s3:*",
                           "Resource": [{"Fn::GetAtt": [name, "Arn"]}, {"Fn::Sub": f"${{{name}.Arn}}/*"}],
                           "Condition": {"Bool": {"aws:SecureTransport": "false"}}}]
        assert (b["DeletionPolicy"], b["UpdateReplacePolicy"]) == ("RetainExceptOnCreate", "Retain")  # kept unless its own create fails


def test_storage_policy_grants_our_prefixes_only(template):
    statements = template["Resources"]["StoragePolicy"]["Properties"]["PolicyDocument"]["Statement"]
    sub = lambda arn: {"Fn::Sub": f"arn:${{AWS::Partition}}:s3:::{arn}"}  # noqa: E731
    by_sid = {s["Sid"]: s for s in statements}
    assert set(by_sid) == {"ListOurBuckets", "ReadData", "CheckpointBackups", "PublishDatasets"}
    for s in statements:
        assert s["Effect"] == "Allow"
        assert all("*" not in a for a in s["Action"]), s
    assert by_sid["ListOurBuckets"]["Resource"] == [sub("training-data-jakarta"), sub("checkpoint-jakarta")]
    assert by_sid["ReadData"] == {"Sid": "ReadData", "Effect": "Allow", "Action": ["s3:GetObject"],
                                  "Resource": [sub("training-data-jakarta/*")]}
    assert by_sid["CheckpointBackups"]["Resource"] == [sub("checkpoint-jakarta/checkpoints/*")]
    assert by_sid["PublishDatasets"]["Resource"] == [sub("training-data-jakarta/datasets/*")]
    writes = {a for s in statements for a in s["Action"] if a != "s3:GetObject"} - {"s3:ListBucket", "s3:ListBucketMultipartUploads"}
    assert writes == {"s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"}
    deleting = [r for s in statements if "s3:DeleteObject" in s["Action"] for r in s["Resource"]]
    assert deleting == [sub("checkpoint-jakarta/checkpoints/*"), sub("training-data-jakarta/datasets/*")], "deletes only under our prefixes"
    assert template["Outputs"]["StoragePolicyArn"] == {"Value": {"Ref": "StoragePolicy"}, "Description": "aws.storage_policy_arn"}


def test_both_buckets_start_versioned(template):
    for name in ("DataBucket", "CheckpointBucket"):
        props = template["Resources"][name]["Properties"]
        assert props["VersioningConfiguration"] == {"Status": "Enabled"}, name
        assert props["LifecycleConfiguration"]["Rules"][0]["NoncurrentVersionExpiration"] == {"NoncurrentDays": 30}


def test_no_account_id_or_key_material(scenario, template):
    text = render_infra_template(template, scenario.name)
    assert not re.search(r"(?<![0-9a-f])\d{12}(?![0-9a-f])", text)
    assert "AKIA" not in text and "PRIVATE KEY" not in text


def test_infra_needs_az_and_two_buckets(make_project):
    with pytest.raises(ConfigError, match="aws.availability_zone is missing"):
        build_infra_template(make_project(lambda r: r["aws"].pop("availability_zone")))
    with pytest.raises(ConfigError, match="use two buckets"):
        build_infra_template(make_project(lambda r: r["aws"]["buckets"].update(checkpoints="training-data-jakarta")))
    assert yaml.safe_load(render_infra_template(build_infra_template(make_project()), "x"))["AWSTemplateFormatVersion"] == "2010-09-09"
