"""What a deploy of the infrastructure stack would change, predicted from two templates with CloudFormation's own
create-only property lists (the provider schemas cfn-lint ships), and what it refuses.

``AWS_DESCRIBE_CHANGE_SET`` is recorded real-format ``DescribeChangeSet`` output (the shape and values of the AWS
CloudFormation API reference, ``ResourceChange`` / ``ResourceChangeDetail``): real CloudFormation cannot run here, and
moto's change sets carry no ``Replacement``.
"""

from __future__ import annotations

import copy

import pytest

from clustertrain.cloud.changeset import create_only, from_aws, merge, predict, refused, shrunk
from clustertrain.cloud.infra import build_infra_template
from clustertrain.project import validate_project
from tests.unit.cloud.conftest import scenario_raw

REGION = "ap-southeast-3"


def template(**network) -> dict:
    raw = stack_raw()
    raw["aws"]["network"].update(network)
    return build_infra_template(validate_project(raw, source="p5e-80x7"))


def stack_raw() -> dict:
    """The deployed scenario whose file systems the stack creates (no file_system_id in the file)."""
    raw = scenario_raw()
    for f in raw["aws"]["fsx"]:
        f.pop("file_system_id")
    return raw


def by_id(changes):
    return {c.logical_id: c for c in changes}


def test_create_only_comes_from_the_provider_schema():
    assert "CidrBlock" in create_only("AWS::EC2::VPC", REGION)
    assert "BucketName" in create_only("AWS::S3::Bucket", REGION)
    assert "CidrBlock" not in (create_only("AWS::EC2::SecurityGroup", REGION) or ())
    assert create_only("AWS::Not::AType", REGION) is None


def test_a_new_stack_adds_every_resource():
    t = template()
    changes = predict({}, t, REGION)
    assert [c.logical_id for c in changes] == list(t["Resources"])
    assert {c.action for c in changes} == {"Add"} and not refused(changes)


def test_the_same_template_changes_nothing():
    assert predict(template(), template(), REGION) == []


def test_a_subnet_cidr_replaces_that_subnet_and_what_hangs_on_it_only():
    changes = by_id(predict(template(), template(public_subnet_cidr="10.0.1.0/24"), REGION))
    assert set(changes) == {"PublicSubnet", "PublicSubnetRoutes", "NatGateway", "PrivateDefaultRoute"}  # the NAT is in it
    assert changes["PublicSubnet"].replaced and "CidrBlock" in changes["PublicSubnet"].why
    assert changes["PublicSubnetRoutes"].replaced and "PublicSubnet" in changes["PublicSubnetRoutes"].why
    assert not refused(list(changes.values()))


def test_a_new_private_subnet_replaces_the_file_systems_in_it_and_is_refused():
    """SubnetIds of AWS::FSx::FileSystem is create-only: a new private subnet means new, empty file systems."""
    changes = predict(template(), template(private_subnet_cidr="10.0.128.0/18"), REGION)
    ids = by_id(changes)
    assert set(ids) == {"PrivateSubnet", "PrivateSubnetRoutes", "FsxData", "FsxCheckpoints", "FsxLogs"}
    assert ids["FsxData"].replaced and ids["FsxData"].why == "it follows the new PrivateSubnet"  # in create-only SubnetIds
    assert sorted(c.logical_id for c in refused(changes)) == ["FsxCheckpoints", "FsxData", "FsxLogs"]


def test_a_file_system_grows_in_place_and_never_shrinks():
    raw = stack_raw()
    raw["aws"]["fsx"][0]["capacity_gb"] *= 2
    grown = build_infra_template(validate_project(raw, source="p5e-80x7"))
    changes = predict(template(), grown, REGION)
    assert [(c.logical_id, c.action, c.replacement) for c in changes] == [("FsxData", "Modify", "False")]
    assert shrunk(template(), grown) == [] and shrunk(grown, template()) == [("FsxData", 14400, 7200)]


def test_a_vpc_cidr_replaces_the_vpc_and_is_refused():
    new = template(vpc_cidr="10.1.0.0/16", public_subnet_cidr="10.1.0.0/24", private_subnet_cidr="10.1.64.0/18")
    changes = predict(template(), new, REGION)
    ids = by_id(changes)
    assert ids["Vpc"].replaced and ids["HeadNodeSecurityGroup"].replaced and ids["ComputeFromHead"].replaced
    assert [c.logical_id for c in refused(changes)] == ["Vpc", "FsxData", "FsxCheckpoints", "FsxLogs"]  # their subnet
    assert "DataBucket" not in ids and "StoragePolicy" not in ids


def test_a_bucket_rename_is_refused_but_a_bucket_setting_is_not():
    old = template()
    renamed = copy.deepcopy(old)
    renamed["Resources"]["DataBucket"]["Properties"]["BucketName"] = "another-bucket-482913650271"
    assert [c.logical_id for c in refused(predict(old, renamed, REGION))] == ["DataBucket"]
    setting = copy.deepcopy(old)
    setting["Resources"]["DataBucket"]["Properties"]["LifecycleConfiguration"]["Rules"][0]["NoncurrentVersionExpiration"]["NoncurrentDays"] = 60
    changes = predict(old, setting, REGION)
    assert [(c.logical_id, c.action, c.replacement) for c in changes] == [("DataBucket", "Modify", "False")]


def test_a_changed_zone_parameter_replaces_both_subnets():
    old, new = template(), template()
    new["Parameters"]["AvailabilityZone"]["Default"] = "ap-southeast-3b"
    ids = by_id(predict(old, new, REGION))
    assert ids["PublicSubnet"].replaced and ids["PrivateSubnet"].replaced and "AvailabilityZone" in ids["PublicSubnet"].why


AWS_DESCRIBE_CHANGE_SET = [
    {"Type": "Resource", "ResourceChange": {
        "Action": "Modify", "LogicalResourceId": "Vpc", "PhysicalResourceId": "vpc-0e1f2a3b4c5d6e7f8",
        "ResourceType": "AWS::EC2::VPC", "Replacement": "True", "Scope": ["Properties"],
        "Details": [{"Target": {"Attribute": "Properties", "Name": "CidrBlock", "RequiresRecreation": "Always"},
                     "Evaluation": "Static", "ChangeSource": "DirectModification"}]}},
    {"Type": "Resource", "ResourceChange": {
        "Action": "Modify", "LogicalResourceId": "DataBucket", "PhysicalResourceId": "p5e-80x7-training-data-jakarta",
        "ResourceType": "AWS::S3::Bucket", "Replacement": "False", "Scope": ["Properties"],
        "Details": [{"Target": {"Attribute": "Properties", "Name": "LifecycleConfiguration", "RequiresRecreation": "Never"},
                     "Evaluation": "Static", "ChangeSource": "DirectModification"}]}},
    {"Type": "Resource", "ResourceChange": {"Action": "Add", "LogicalResourceId": "Extra", "ResourceType": "AWS::SNS::Topic"}},
]


def test_aws_change_sets_are_read_and_refused_on_their_own_word():
    changes = from_aws(AWS_DESCRIBE_CHANGE_SET)
    assert [(c.action, c.logical_id, c.replacement) for c in changes] == [
        ("Modify", "Vpc", "True"), ("Modify", "DataBucket", "False"), ("Add", "Extra", "")]
    assert changes[0].why == "CidrBlock changed" and changes[0].physical_id == "vpc-0e1f2a3b4c5d6e7f8"
    assert [c.logical_id for c in refused(changes)] == ["Vpc"]
    assert "replace" in changes[0].describe() and changes[1].describe().startswith("modify")


@pytest.mark.parametrize("aws_says", ["", "False"])
def test_a_prediction_sharpens_an_answer_without_replacement(aws_says):
    """moto (and a change set described before its details are computed) may leave Replacement out: the prediction
    still refuses a replaced bucket; a resource AWS does not list is not invented."""
    aws = from_aws([{"Type": "Resource", "ResourceChange": {
        "Action": "Modify", "LogicalResourceId": "DataBucket", "ResourceType": "AWS::S3::Bucket", "Replacement": aws_says}}])
    old = template()
    new = copy.deepcopy(old)
    new["Resources"]["DataBucket"]["Properties"]["BucketName"] = "another-bucket-482913650271"
    merged = merge(aws, predict(old, new, REGION))
    assert [c.logical_id for c in merged] == ["DataBucket"]
    assert merged[0].replacement == "True" and [c.logical_id for c in refused(merged)] == ["DataBucket"]
