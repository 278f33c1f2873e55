"""moto's server with our CloudFormation fixes (tests/support/moto_cfn_server.py), proven over HTTP with boto3 on the
flagship template: examples/p5e-80x7.yaml -> ``build_infra_template`` -> ``render_infra_template``, deployed the way
``clustertrain cluster infra deploy`` does (create_change_set -> describe_change_set -> execute_change_set -> poll
describe_stacks / describe_stack_events -> Outputs) and removed with delete_stack.

``flagship`` is deployed once and only read. Tests that change a stack deploy their own, with their own bucket names
(project overrides): the buckets are kept by a stack delete (``RetainExceptOnCreate``) and outlive their stack, as on AWS.

The FSx for Lustre file systems the flagship creates are tested in test_moto_fsx.py; the stack-level tests here that
are not about them use projects whose file systems all exist already (``project_for(..., fsx=False)``: the template
creates none), because a kept file system holds its subnet and security group, as on AWS. Helpers and the ``aws`` /
``flagship`` fixtures: tests/support/cfn_stacks.py.
"""

from __future__ import annotations

import botocore.exceptions
import pytest

from clustertrain.cloud.infra import build_infra_template, storage_policy_document
from clustertrain.cloud.state import fsx_output
from tests.support.cfn_stacks import (  # noqa: F401 - aws, flagship: fixtures
    aws, body_of, change, created_fsx, error_code, events, flagship, outputs, project_for, wait)


def test_a_create_change_set_deploys_the_template_with_all_its_outputs(aws, flagship):
    project, described, stack = flagship
    template = build_infra_template(project)
    assert (described["Status"], described["ExecutionStatus"]) == ("CREATE_COMPLETE", "AVAILABLE")
    assert {c["ResourceChange"]["LogicalResourceId"] for c in described["Changes"]} == set(template["Resources"])
    assert stack["StackStatus"] == "CREATE_COMPLETE"
    out = outputs(stack)
    assert created_fsx(project) and set(out) == set(template["Outputs"]) and len(out) == 8 + len(created_fsx(project))
    cf, ec2, s3, iam = (aws[k] for k in ("cloudformation", "ec2", "s3", "iam"))
    assert cf.describe_change_set(ChangeSetName="deploy-1", StackName="p5e-80x7-infra")["ExecutionStatus"] == "EXECUTE_COMPLETE"

    net = project.aws.network
    assert ec2.describe_vpcs(VpcIds=[out["VpcId"]])["Vpcs"][0]["CidrBlock"] == net.vpc_cidr
    subnets = {s["SubnetId"]: s for s in ec2.describe_subnets(SubnetIds=[out["PublicSubnetId"], out["PrivateSubnetId"]])["Subnets"]}
    assert subnets[out["PublicSubnetId"]]["CidrBlock"] == net.public_subnet_cidr
    assert subnets[out["PrivateSubnetId"]]["CidrBlock"] == net.private_subnet_cidr
    assert {s["VpcId"] for s in subnets.values()} == {out["VpcId"]}
    assert {s["AvailabilityZone"] for s in subnets.values()} == {project.aws.availability_zone}
    groups = ec2.describe_security_groups(GroupIds=[out["HeadNodeSecurityGroupId"], out["ComputeSecurityGroupId"]])
    assert {g["VpcId"] for g in groups["SecurityGroups"]} == {out["VpcId"]}
    assert (out["DataBucketName"], out["CheckpointBucketName"]) == (project.aws.buckets.data, project.aws.buckets.checkpoints)
    for bucket in (out["DataBucketName"], out["CheckpointBucketName"]):
        s3.head_bucket(Bucket=bucket)
    policy = iam.get_policy(PolicyArn=out["StoragePolicyArn"])["Policy"]
    version = iam.get_policy_version(PolicyArn=out["StoragePolicyArn"], VersionId=policy["DefaultVersionId"])
    assert version["PolicyVersion"]["Document"] == storage_policy_document(project, partition="aws")


def test_the_resources_are_wired_and_configured_as_the_template_says(aws, flagship):
    project, _, stack = flagship
    out, ec2, s3 = outputs(stack), aws["ec2"], aws["s3"]
    tables = ec2.describe_route_tables(Filters=[{"Name": "vpc-id", "Values": [out["VpcId"]]}])["RouteTables"]
    by_subnet = {a["SubnetId"]: t for t in tables for a in t["Associations"] if a.get("SubnetId")}
    default = lambda t: next(r for r in t["Routes"] if r.get("DestinationCidrBlock") == "0.0.0.0/0")  # noqa: E731
    assert default(by_subnet[out["PrivateSubnetId"]])["NatGatewayId"].startswith("nat-")
    assert default(by_subnet[out["PublicSubnetId"]])["GatewayId"].startswith("igw-")
    endpoint = ec2.describe_vpc_endpoints(Filters=[{"Name": "vpc-id", "Values": [out["VpcId"]]}])["VpcEndpoints"][0]
    assert set(endpoint["RouteTableIds"]) == {t["RouteTableId"] for t in by_subnet.values()}

    head, compute = out["HeadNodeSecurityGroupId"], out["ComputeSecurityGroupId"]
    groups = {g["GroupId"]: g for g in ec2.describe_security_groups(GroupIds=[head, compute])["SecurityGroups"]}
    sources = lambda perms: {p["GroupId"] for perm in perms for p in perm["UserIdGroupPairs"]}  # noqa: E731
    assert sources(groups[compute]["IpPermissions"]) == {head, compute}
    assert sources(groups[head]["IpPermissions"]) == {compute}
    assert {r["CidrIp"] for perm in groups[head]["IpPermissions"] for r in perm["IpRanges"]} == {project.aws.network.ssh_cidr}
    assert compute in sources(groups[compute]["IpPermissionsEgress"])

    for bucket in (out["DataBucketName"], out["CheckpointBucketName"]):
        assert s3.get_bucket_versioning(Bucket=bucket)["Status"] == "Enabled"
        assert all(s3.get_public_access_block(Bucket=bucket)["PublicAccessBlockConfiguration"].values())
        assert s3.get_bucket_ownership_controls(Bucket=bucket)["OwnershipControls"]["Rules"] == [{"ObjectOwnership": "BucketOwnerEnforced"}]
        rule = s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"][0]
        assert rule["NoncurrentVersionExpiration"]["NoncurrentDays"] == 30
        assert '"aws:SecureTransport": "false"' in s3.get_bucket_policy(Bucket=bucket)["Policy"]


def test_every_resource_reports_its_own_events_in_dependency_order(aws, flagship):
    project, _, stack = flagship
    seen = events(aws["cloudformation"], stack["StackId"])
    template = build_infra_template(project)
    assert [e["ResourceStatus"] for e in seen if e["LogicalResourceId"] == "p5e-80x7-infra"] == [
        "REVIEW_IN_PROGRESS", "CREATE_IN_PROGRESS", "CREATE_COMPLETE"]
    assert len({e["EventId"] for e in seen}) == len(seen)
    at = {(e["LogicalResourceId"], e["ResourceStatus"]): i for i, e in enumerate(seen)}
    for logical, resource in template["Resources"].items():
        mine = [e for e in seen if e["LogicalResourceId"] == logical]
        assert [e["ResourceStatus"] for e in mine] == ["CREATE_IN_PROGRESS", "CREATE_COMPLETE"], logical
        assert {e["ResourceType"] for e in mine} == {resource["Type"]}
    physical = {e["LogicalResourceId"]: e["PhysicalResourceId"] for e in seen if e["ResourceStatus"] == "CREATE_COMPLETE"}
    out = outputs(stack)
    assert (physical["Vpc"], physical["PrivateSubnet"], physical["DataBucket"]) == (
        out["VpcId"], out["PrivateSubnetId"], out["DataBucketName"])
    for first, then in [("Vpc", "PublicSubnet"), ("GatewayAttachment", "NatEip"), ("NatEip", "NatGateway"),
                        ("PublicSubnet", "NatGateway"), ("NatGateway", "PrivateDefaultRoute"), ("DataBucket", "DataBucketPolicy")]:
        assert at[(first, "CREATE_COMPLETE")] < at[(then, "CREATE_IN_PROGRESS")], (first, then)


def test_delete_removes_everything_but_the_retained_buckets(aws):
    cf, ec2, s3, iam = (aws[k] for k in ("cloudformation", "ec2", "s3", "iam"))
    project = project_for("gone", fsx=False)
    _, stack = change(cf, "gone", project)
    resources = cf.describe_stack_resources(StackName="gone")["StackResources"]
    physical = {r["LogicalResourceId"]: r.get("PhysicalResourceId") for r in resources}
    assert set(physical) == set(build_infra_template(project)["Resources"]) and all(physical.values())
    out = outputs(stack)

    cf.delete_stack(StackName="gone")
    assert wait(cf, stack["StackId"])["StackStatus"] == "DELETE_COMPLETE"
    assert error_code(lambda: cf.describe_stacks(StackName="gone")) == "ValidationError"
    assert error_code(lambda: ec2.describe_vpcs(VpcIds=[out["VpcId"]])) == "InvalidVpcID.NotFound"
    assert error_code(lambda: ec2.describe_subnets(SubnetIds=[out["PrivateSubnetId"]])) == "InvalidSubnetID.NotFound"
    assert ec2.describe_route_tables(Filters=[{"Name": "vpc-id", "Values": [out["VpcId"]]}])["RouteTables"] == []
    assert error_code(lambda: ec2.describe_security_groups(GroupIds=[out["HeadNodeSecurityGroupId"]])) == "InvalidGroup.NotFound"
    assert error_code(lambda: ec2.describe_internet_gateways(InternetGatewayIds=[physical["InternetGateway"]])) \
        == "InvalidInternetGatewayID.NotFound"
    assert ec2.describe_addresses(Filters=[{"Name": "public-ip", "Values": [physical["NatEip"]]}])["Addresses"] == []
    assert ec2.describe_nat_gateways(NatGatewayIds=[physical["NatGateway"]])["NatGateways"][0]["State"] == "deleted"
    assert error_code(lambda: iam.get_policy(PolicyArn=out["StoragePolicyArn"])) == "NoSuchEntity"
    for bucket in (out["DataBucketName"], out["CheckpointBucketName"]):  # Retain: kept, without their bucket policy
        assert s3.get_bucket_versioning(Bucket=bucket)["Status"] == "Enabled"
        assert error_code(lambda b=bucket: s3.get_bucket_policy(Bucket=b)) == "NoSuchBucketPolicy"

    final = {e["LogicalResourceId"]: e["ResourceStatus"] for e in events(cf, stack["StackId"])}
    assert final.pop("gone") == "DELETE_COMPLETE"
    assert {k: v for k, v in final.items() if v != "DELETE_COMPLETE"} == {
        "DataBucket": "DELETE_SKIPPED", "CheckpointBucket": "DELETE_SKIPPED"}
    assert set(final) == set(build_infra_template(project)["Resources"])


def test_a_new_private_subnet_cidr_replaces_the_subnet(aws):
    cf, ec2 = aws["cloudformation"], aws["ec2"]
    _, before = change(cf, "cidr", project_for("cidr", fsx=False))
    described, after = change(cf, "cidr", project_for("cidr", "aws.network.private_subnet_cidr=10.0.128.0/18", fsx=False),
                              "UPDATE", "deploy-2")
    assert ("Modify", "PrivateSubnet") in {(c["ResourceChange"]["Action"], c["ResourceChange"]["LogicalResourceId"])
                                           for c in described["Changes"]}
    assert after["StackStatus"] == "UPDATE_COMPLETE"
    old, new = outputs(before), outputs(after)
    assert new["PrivateSubnetId"] != old["PrivateSubnetId"]
    assert {k: v for k, v in new.items() if k != "PrivateSubnetId"} == {k: v for k, v in old.items() if k != "PrivateSubnetId"}
    subnet = ec2.describe_subnets(SubnetIds=[new["PrivateSubnetId"]])["Subnets"][0]
    assert (subnet["CidrBlock"], subnet["VpcId"]) == ("10.0.128.0/18", new["VpcId"])
    assert error_code(lambda: ec2.describe_subnets(SubnetIds=[old["PrivateSubnetId"]])) == "InvalidSubnetID.NotFound"
    table = ec2.describe_route_tables(Filters=[{"Name": "association.subnet-id", "Values": [new["PrivateSubnetId"]]}])
    assert any(r.get("NatGatewayId") for r in table["RouteTables"][0]["Routes"])
    cleanup = [(e["LogicalResourceId"], e["ResourceStatus"], e["PhysicalResourceId"]) for e in events(cf, "cidr")]
    assert ("PrivateSubnet", "DELETE_COMPLETE", old["PrivateSubnetId"]) in cleanup
    assert ("cidr", "UPDATE_COMPLETE_CLEANUP_IN_PROGRESS") in {(n, s) for n, s, _ in cleanup}


def test_a_new_ssh_cidr_updates_the_head_security_group_in_place(aws):
    """The head group's GroupDescription (create-only) is fixed text (clustertrain/cloud/infra.py), so a new SSH CIDR
    changes only its ingress rules: the group keeps its id under a running head node."""
    cf, ec2 = aws["cloudformation"], aws["ec2"]
    _, before = change(cf, "ssh", project_for("ssh"))
    _, after = change(cf, "ssh", project_for("ssh", "aws.network.ssh_cidr=198.51.100.0/24"), "UPDATE", "deploy-2")
    assert after["StackStatus"] == "UPDATE_COMPLETE"
    old, new = outputs(before), outputs(after)
    head, compute = new["HeadNodeSecurityGroupId"], new["ComputeSecurityGroupId"]
    assert head == old["HeadNodeSecurityGroupId"] and compute == old["ComputeSecurityGroupId"]
    groups = {g["GroupId"]: g for g in ec2.describe_security_groups(GroupIds=[head, compute])["SecurityGroups"]}
    assert {r["CidrIp"] for perm in groups[head]["IpPermissions"] for r in perm["IpRanges"]} == {"198.51.100.0/24"}
    assert {p["GroupId"] for perm in groups[compute]["IpPermissions"] for p in perm["UserIdGroupPairs"]} == {head, compute}


def test_a_tags_only_change_keeps_every_resource(aws):
    cf, ec2, s3 = aws["cloudformation"], aws["ec2"], aws["s3"]
    _, before = change(cf, "tags", project_for("tags"))
    _, after = change(cf, "tags", project_for("tags", "aws.tags.Environment=Staging"), "UPDATE", "deploy-2")
    assert after["StackStatus"] == "UPDATE_COMPLETE"
    out = outputs(after)
    assert out == outputs(before)
    tagged = [*ec2.describe_vpcs(VpcIds=[out["VpcId"]])["Vpcs"],
              *ec2.describe_subnets(SubnetIds=[out["PrivateSubnetId"]])["Subnets"],
              *ec2.describe_security_groups(GroupIds=[out["HeadNodeSecurityGroupId"]])["SecurityGroups"]]
    assert [{t["Key"]: t["Value"] for t in r["Tags"]}["Environment"] for r in tagged] == ["Staging"] * 3
    bucket_tags = {t["Key"]: t["Value"] for t in s3.get_bucket_tagging(Bucket=out["DataBucketName"])["TagSet"]}
    assert bucket_tags["Environment"] == "Staging"
    fs_ids = [out[fsx_output(f.name)] for f in created_fsx(project_for("tags"))]  # kept, retagged in place
    file_systems = aws["fsx"].describe_file_systems(FileSystemIds=fs_ids)["FileSystems"]
    assert fs_ids and [{t["Key"]: t["Value"] for t in f["Tags"]}["Environment"] for f in file_systems] == ["Staging"] * len(fs_ids)


def test_a_failed_create_rolls_back_and_the_stack_can_only_be_deleted(aws):
    cf, ec2, s3 = aws["cloudformation"], aws["ec2"], aws["s3"]
    project = project_for("taken", fsx=False)
    s3.create_bucket(Bucket=project.aws.buckets.data,
                     CreateBucketConfiguration={"LocationConstraint": project.aws.region})  # someone has the name
    _, stack = change(cf, "taken", project)  # ExecuteChangeSet itself succeeds
    assert stack["StackStatus"] == "ROLLBACK_COMPLETE" and "Outputs" not in stack
    seen = events(cf, "taken")
    failure = next(e for e in seen if e["ResourceStatus"] == "CREATE_FAILED")
    assert failure["LogicalResourceId"] == "DataBucket" and "BucketAlreadyExists" in failure["ResourceStatusReason"]
    assert "[DataBucket]" in next(e for e in seen if e["ResourceStatus"] == "ROLLBACK_IN_PROGRESS")["ResourceStatusReason"]
    created = {e["LogicalResourceId"] for e in seen if e["ResourceStatus"] == "CREATE_COMPLETE"} - {"taken"}
    removed = {e["LogicalResourceId"] for e in seen if e["ResourceStatus"] in ("DELETE_COMPLETE", "DELETE_SKIPPED")}
    assert "Vpc" in created and created <= removed
    vpc = next(e["PhysicalResourceId"] for e in seen if (e["LogicalResourceId"], e["ResourceStatus"]) == ("Vpc", "CREATE_COMPLETE"))
    assert error_code(lambda: ec2.describe_vpcs(VpcIds=[vpc])) == "InvalidVpcID.NotFound"

    for kind in ("CREATE", "UPDATE"):
        with pytest.raises(botocore.exceptions.ClientError, match="already exists|ROLLBACK_COMPLETE state"):
            cf.create_change_set(StackName="taken", ChangeSetName=f"again-{kind.lower()}", ChangeSetType=kind,
                                 TemplateBody=body_of(project), Capabilities=["CAPABILITY_IAM"])
    cf.delete_stack(StackName="taken")
    assert wait(cf, stack["StackId"])["StackStatus"] == "DELETE_COMPLETE"


def test_a_failed_update_rolls_back_to_the_previous_template(aws):
    """The update replaces the private subnet (new CIDR), then fails on the data bucket (its new name is taken)."""
    cf, ec2, s3 = aws["cloudformation"], aws["ec2"], aws["s3"]
    _, before = change(cf, "renamed", project_for("renamed", fsx=False))
    taken = project_for("renamed-taken")
    s3.create_bucket(Bucket=taken.aws.buckets.data, CreateBucketConfiguration={"LocationConstraint": taken.aws.region})
    _, after = change(cf, "renamed", project_for("renamed", f"aws.buckets.data={taken.aws.buckets.data}",
                                                 "aws.network.private_subnet_cidr=10.0.128.0/18", fsx=False), "UPDATE", "deploy-2")
    assert after["StackStatus"] == "UPDATE_ROLLBACK_COMPLETE"
    assert outputs(after) == outputs(before)
    cidrs = [s["CidrBlock"] for s in ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [outputs(after)["VpcId"]]}])["Subnets"]]
    assert sorted(cidrs) == ["10.0.0.0/24", "10.0.64.0/18"]
    seen = events(cf, "renamed")
    assert [e["LogicalResourceId"] for e in seen if e["ResourceStatus"] == "UPDATE_FAILED"] == ["DataBucket"]
    assert [e["ResourceStatusReason"] for e in seen if e["ResourceStatus"] == "UPDATE_ROLLBACK_IN_PROGRESS"] == [
        "The following resource(s) failed to update: [DataBucket]. "]
    assert cf.describe_change_set(ChangeSetName="deploy-2", StackName="renamed")["ExecutionStatus"] == "EXECUTE_FAILED"
    assert cf.get_template(StackName="renamed")["TemplateBody"] == body_of(project_for("renamed", fsx=False))
    iam, arn = aws["iam"], outputs(after)["StoragePolicyArn"]
    version = iam.get_policy_version(PolicyArn=arn, VersionId=iam.get_policy(PolicyArn=arn)["Policy"]["DefaultVersionId"])
    assert version["PolicyVersion"]["Document"] == storage_policy_document(project_for("renamed", fsx=False), partition="aws")
