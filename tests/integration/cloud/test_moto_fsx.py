"""FSx for Lustre on moto's CloudFormation server (tests/support/moto_fsx.py), proven over HTTP with boto3: the flagship's
template creates the example's file systems (``Fsx<Name>``, ``DeletionPolicy: RetainExceptOnCreate``) in the private
subnet with their interfaces in the FSx security group, and ParallelCluster's own check of an existing file system
(ExistingFsxNetworkingValidator) runs against them. Their updates and deletes are tried on one of them in stacks of
its own (:func:`fsx_stack`, on the flagship's network). A kept file system holds its subnet and security group, as on
AWS: the stack delete fails until it is gone (clustertrain's ``infra delete --delete-file-systems`` deletes them first).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from clustertrain.cloud.infra import build_infra_template
from clustertrain.cloud.state import fsx_logical_id, fsx_output
from tests.support.cfn_stacks import (  # noqa: F401 - aws, flagship: fixtures
    aws, change, created_fsx, error_code, events, flagship, outputs, project_for, wait)


def physical(cf, stack: str, logical: str) -> str:
    return cf.describe_stack_resource(StackName=stack, LogicalResourceId=logical)["StackResourceDetail"]["PhysicalResourceId"]


def file_system(aws, fs_id: str) -> dict:
    return aws["fsx"].describe_file_systems(FileSystemIds=[fs_id])["FileSystems"][0]


def test_the_file_systems_are_made_in_the_private_subnet_with_their_interfaces_in_the_fsx_group(aws, flagship):
    """What ParallelCluster reads of an existing FSx (``FsxLustreSettings: {FileSystemId}``): an id its schema accepts,
    the VPC, the subnets, and the network interfaces with their security groups (DescribeFileSystems has none)."""
    from pcluster.schemas.cluster_schema import FsxLustreSettingsSchema

    project, _, stack = flagship
    cf, ec2, out = aws["cloudformation"], aws["ec2"], outputs(stack)
    fsx_group = physical(cf, "p5e-80x7-infra", "FsxSecurityGroup")
    seen = events(cf, stack["StackId"])
    for f in created_fsx(project):
        fs_id = out[fsx_output(f.name)]
        assert FsxLustreSettingsSchema().validate({"FileSystemId": fs_id}) == {}
        fs = file_system(aws, fs_id)
        assert (fs["Lifecycle"], fs["FileSystemType"], fs["StorageCapacity"], fs["StorageType"]) == (
            "AVAILABLE", "LUSTRE", f.capacity_gb, "SSD")
        assert (fs["SubnetIds"], fs["VpcId"]) == ([out["PrivateSubnetId"]], out["VpcId"])
        lustre = fs["LustreConfiguration"]
        assert (lustre["DeploymentType"], lustre.get("PerUnitStorageThroughput"), lustre["DataCompressionType"]) == (
            f.deployment_type, f.effective_throughput, f.compression)
        assert len(lustre["MountName"]) == 8 and fs["DNSName"].startswith(f"{fs_id}.fsx.{project.aws.region}.")
        tags = {t["Key"]: t["Value"] for t in fs["Tags"]}
        assert (tags["aws:cloudformation:logical-id"], tags["aws:cloudformation:stack-id"]) == (
            fsx_logical_id(f.name), stack["StackId"])
        enis = ec2.describe_network_interfaces(NetworkInterfaceIds=fs["NetworkInterfaceIds"])["NetworkInterfaces"]
        assert enis and {(e["SubnetId"], e["VpcId"], e["Status"]) for e in enis} == {
            (out["PrivateSubnetId"], out["VpcId"], "in-use")}
        assert {g["GroupId"] for e in enis for g in e["Groups"]} == {fsx_group}
        mine = [(e["ResourceStatus"], e["PhysicalResourceId"]) for e in seen if e["LogicalResourceId"] == fsx_logical_id(f.name)]
        assert mine == [("CREATE_IN_PROGRESS", ""), ("CREATE_COMPLETE", fs_id)]


def test_pclusters_check_of_an_existing_fsx_passes_for_the_file_systems_the_stack_made(aws, flagship, cfn_endpoint,
                                                                                       monkeypatch):
    """pcluster's own ExistingFsxNetworkingValidator (pcluster/validators/cluster_validators.py), as ``create-cluster
    --dryrun`` runs it for ``FsxLustreSettings: {FileSystemId}`` (DescribeFileSystems, DescribeSubnets,
    DescribeNetworkInterfaces, DescribeSecurityGroups, here on this server), for the nodes' groups as clustertrain's
    cluster config gives them (AdditionalSecurityGroups, next to pcluster's managed group: none yet at create). It
    fails for a file system whose group lets nothing in, and for one that does not exist."""
    from pcluster.aws.aws_api import AWSApi
    from pcluster.aws.common import Cache
    from pcluster.validators.cluster_validators import ExistingFsxNetworkingValidator

    project, _, stack = flagship
    out = outputs(stack)
    monkeypatch.setenv("AWS_ENDPOINT_URL", cfn_endpoint)
    monkeypatch.setenv("AWS_DEFAULT_REGION", project.aws.region)
    closed = aws["ec2"].create_security_group(GroupName="no-rules", Description="no rules", VpcId=out["VpcId"])["GroupId"]
    unreachable = aws["fsx"].create_file_system(FileSystemType="LUSTRE", StorageCapacity=1200, SubnetIds=[out["PrivateSubnetId"]],
                                                SecurityGroupIds=[closed])["FileSystem"]["FileSystemId"]
    nodes = {frozenset({None, out["HeadNodeSecurityGroupId"]}), frozenset({None, out["ComputeSecurityGroupId"]})}

    def check(*fs_ids: str) -> list[str]:
        AWSApi.reset()
        Cache.clear_all()
        try:
            return [r.message for r in ExistingFsxNetworkingValidator().execute(
                file_storage_ids=list(fs_ids), subnet_ids=[out["PublicSubnetId"], out["PrivateSubnetId"]],
                security_groups_by_nodes=nodes)]
        finally:
            AWSApi.reset()

    assert check(*(out[fsx_output(f.name)] for f in created_fsx(project))) == []
    [refused] = check(unreachable)
    assert f"file storage '{unreachable}' does not satisfy mounting requirement" in refused and "Missing ports: [988]" in refused
    missing = "fs-0123456789abcdef0"
    assert check(missing) == [f"File system '{missing}' does not exist."]


def fsx_stack(cf, stack: str, flagship: tuple, kind: str = "CREATE", name: str = "deploy-1", retain: bool = True,
              **changes: Any) -> dict:
    """A stack with one file system: the flagship template's first ``Fsx<Name>`` on the flagship's private subnet and
    FSx group (parameters), with ``changes`` to its Properties (``LustreConfiguration`` keys merged), without
    DeletionPolicy / UpdateReplacePolicy unless ``retain``; output ``FsId`` (Ref) and ``MountName`` (GetAtt)."""
    project, _, deployed = flagship
    logical = fsx_logical_id(created_fsx(project)[0].name)
    body = json.loads(json.dumps(build_infra_template(project)["Resources"][logical]))
    body.pop("DependsOn", None)
    if not retain:
        body.pop("DeletionPolicy"), body.pop("UpdateReplacePolicy")
    props = body["Properties"]
    props.update(SubnetIds=[{"Ref": "Subnet"}], SecurityGroupIds=[{"Ref": "Group"}])
    props["LustreConfiguration"].update(changes.pop("LustreConfiguration", {}))
    props.update(changes)
    template = {"Parameters": {"Subnet": {"Type": "String"}, "Group": {"Type": "String"}}, "Resources": {"Fs": body},
                "Outputs": {"FsId": {"Value": {"Ref": "Fs"}}, "MountName": {"Value": {"Fn::GetAtt": ["Fs", "LustreMountName"]}}}}
    params = [{"ParameterKey": "Subnet", "ParameterValue": outputs(deployed)["PrivateSubnetId"]},
              {"ParameterKey": "Group", "ParameterValue": physical(cf, "p5e-80x7-infra", "FsxSecurityGroup")}]
    made = cf.create_change_set(StackName=stack, ChangeSetName=name, ChangeSetType=kind, TemplateBody=json.dumps(template),
                                Parameters=params)
    cf.execute_change_set(ChangeSetName=name, StackName=stack)
    return wait(cf, made["StackId"])


def test_a_larger_storage_capacity_updates_the_file_system_in_place_and_a_smaller_one_rolls_back(aws, flagship):
    cf, f = aws["cloudformation"], created_fsx(flagship[0])[0]
    before = outputs(fsx_stack(cf, "fsx-grow", flagship))
    assert before["MountName"] == file_system(aws, before["FsId"])["LustreConfiguration"]["MountName"]
    grown = f.capacity_gb + 2400
    after = fsx_stack(cf, "fsx-grow", flagship, "UPDATE", "deploy-2", StorageCapacity=grown,
                      LustreConfiguration={"PerUnitStorageThroughput": 500})
    assert after["StackStatus"] == "UPDATE_COMPLETE" and outputs(after) == before
    fs = file_system(aws, before["FsId"])
    assert (fs["StorageCapacity"], fs["LustreConfiguration"]["PerUnitStorageThroughput"]) == (grown, 500)
    mine = [(e["ResourceStatus"], e["PhysicalResourceId"]) for e in events(cf, "fsx-grow") if e["LogicalResourceId"] == "Fs"]
    assert mine[2:] == [("UPDATE_IN_PROGRESS", before["FsId"]), ("UPDATE_COMPLETE", before["FsId"])]

    shrunk = fsx_stack(cf, "fsx-grow", flagship, "UPDATE", "deploy-3")  # back to the project's capacity: FSx cannot shrink
    assert shrunk["StackStatus"] == "UPDATE_ROLLBACK_COMPLETE" and outputs(shrunk) == before
    failure = next(e for e in events(cf, "fsx-grow") if e["ResourceStatus"] == "UPDATE_FAILED")
    assert failure["LogicalResourceId"] == "Fs" and failure["ResourceStatusReason"].startswith("BadRequest: ")
    assert file_system(aws, before["FsId"])["StorageCapacity"] == grown


@pytest.mark.parametrize("retain", [True, False], ids=["retained", "not-retained"])
def test_a_new_deployment_type_replaces_the_file_system_keeping_the_old_one_only_if_retained(aws, flagship, retain):
    cf, ec2 = aws["cloudformation"], aws["ec2"]
    stack = f"fsx-type-{retain}".lower()
    before = outputs(fsx_stack(cf, stack, flagship, retain=retain))
    old_enis = file_system(aws, before["FsId"])["NetworkInterfaceIds"]
    after = fsx_stack(cf, stack, flagship, "UPDATE", "deploy-2", retain=retain,
                      LustreConfiguration={"DeploymentType": "PERSISTENT_1", "PerUnitStorageThroughput": 200})
    assert after["StackStatus"] == "UPDATE_COMPLETE" and outputs(after)["FsId"] != before["FsId"]
    assert file_system(aws, outputs(after)["FsId"])["LustreConfiguration"]["DeploymentType"] == "PERSISTENT_1"
    seen = [(e["LogicalResourceId"], e["ResourceStatus"], e["PhysicalResourceId"]) for e in events(cf, stack)]
    if retain:  # UpdateReplacePolicy: Retain
        old = file_system(aws, before["FsId"])
        assert old["LustreConfiguration"]["DeploymentType"] == created_fsx(flagship[0])[0].deployment_type
        kept = ec2.describe_network_interfaces(NetworkInterfaceIds=old_enis)["NetworkInterfaces"]
        assert [e["NetworkInterfaceId"] for e in kept] == old_enis
        assert ("Fs", "DELETE_SKIPPED", before["FsId"]) in seen
    else:
        assert error_code(lambda: aws["fsx"].describe_file_systems(FileSystemIds=[before["FsId"]])) == "FileSystemNotFound"
        assert error_code(lambda: ec2.describe_network_interfaces(NetworkInterfaceIds=old_enis)) == \
            "InvalidNetworkInterfaceID.NotFound"
        assert ("Fs", "DELETE_COMPLETE", before["FsId"]) in seen


@pytest.mark.parametrize("retain", [True, False], ids=["retained", "not-retained"])
def test_delete_keeps_a_retained_file_system_and_deletes_one_without_retain(aws, flagship, retain):
    cf, ec2 = aws["cloudformation"], aws["ec2"]
    stack = fsx_stack(cf, f"fsx-delete-{retain}".lower(), flagship, retain=retain)
    fs_id = outputs(stack)["FsId"]
    enis = file_system(aws, fs_id)["NetworkInterfaceIds"]
    cf.delete_stack(StackName=stack["StackId"])
    assert wait(cf, stack["StackId"])["StackStatus"] == "DELETE_COMPLETE"
    assert {e["LogicalResourceId"]: e["ResourceStatus"] for e in events(cf, stack["StackId"])}["Fs"] == (
        "DELETE_SKIPPED" if retain else "DELETE_COMPLETE")
    if retain:
        assert file_system(aws, fs_id)["Lifecycle"] == "AVAILABLE"
        assert len(ec2.describe_network_interfaces(NetworkInterfaceIds=enis)["NetworkInterfaces"]) == len(enis)
    else:
        assert error_code(lambda: aws["fsx"].describe_file_systems(FileSystemIds=[fs_id])) == "FileSystemNotFound"
        assert error_code(lambda: ec2.describe_network_interfaces(NetworkInterfaceIds=enis)) == "InvalidNetworkInterfaceID.NotFound"


def test_kept_file_systems_hold_their_subnet_and_group_so_the_stack_delete_fails_until_they_are_gone(aws):
    """The infrastructure stack keeps its file systems (Retain); their network interfaces then hold the private subnet
    and the FSx group, which EC2 refuses to delete (DependencyViolation): DeleteStack ends DELETE_FAILED, and completes
    once the file systems are deleted."""
    cf, ec2, project = aws["cloudformation"], aws["ec2"], project_for("kept")
    _, stack = change(cf, "kept", project)
    out = outputs(stack)
    fs_ids = [out[fsx_output(f.name)] for f in created_fsx(project)]
    cf.delete_stack(StackName="kept")
    assert wait(cf, stack["StackId"])["StackStatus"] == "DELETE_FAILED"
    seen = events(cf, stack["StackId"])
    failure = next(e for e in seen if e["ResourceStatus"] == "DELETE_FAILED" and e["LogicalResourceId"] != "kept")
    assert failure["LogicalResourceId"] in ("FsxSecurityGroup", "PrivateSubnet")
    assert failure["ResourceStatusReason"].startswith("DependencyViolation: ")
    assert {e["LogicalResourceId"] for e in seen if e["ResourceStatus"] == "DELETE_SKIPPED"} >= {
        fsx_logical_id(f.name) for f in created_fsx(project)}
    kept = aws["fsx"].describe_file_systems(FileSystemIds=fs_ids)["FileSystems"]
    assert [fs["Lifecycle"] for fs in kept] == ["AVAILABLE"] * len(created_fsx(project))

    for fs_id in fs_ids:
        aws["fsx"].delete_file_system(FileSystemId=fs_id)
    cf.delete_stack(StackName="kept")
    assert wait(cf, stack["StackId"])["StackStatus"] == "DELETE_COMPLETE"
    assert error_code(lambda: ec2.describe_vpcs(VpcIds=[out["VpcId"]])) == "InvalidVpcID.NotFound"


def test_a_failed_first_deploy_leaves_no_file_system_and_no_bucket_behind(aws):
    """The file systems are made after the buckets (DependsOn): a taken bucket name fails the deploy before any is
    made, and the rollback deletes the other bucket (RetainExceptOnCreate), so the stack ends ROLLBACK_COMPLETE."""
    cf, s3, project = aws["cloudformation"], aws["s3"], project_for("taken-fsx")
    s3.create_bucket(Bucket=project.aws.buckets.checkpoints, CreateBucketConfiguration={"LocationConstraint": project.aws.region})
    _, stack = change(cf, "taken-fsx", project)
    assert stack["StackStatus"] == "ROLLBACK_COMPLETE" and "Outputs" not in stack
    seen = events(cf, "taken-fsx")
    assert next(e for e in seen if e["ResourceStatus"] == "CREATE_FAILED")["LogicalResourceId"] == "CheckpointBucket"
    assert not [e for e in seen if e["ResourceType"] == "AWS::FSx::FileSystem"]
    last = {e["LogicalResourceId"]: e["ResourceStatus"] for e in seen}
    assert last["DataBucket"] == "DELETE_COMPLETE" and "DELETE_SKIPPED" not in last.values()  # nothing left behind
    assert project.aws.buckets.data not in {b["Name"] for b in s3.list_buckets()["Buckets"]}
    cf.delete_stack(StackName="taken-fsx")
    assert wait(cf, stack["StackId"])["StackStatus"] == "DELETE_COMPLETE"


def test_the_rollback_of_the_create_that_made_a_file_system_deletes_it(aws, flagship):
    """RetainExceptOnCreate: kept by a stack delete (test above), deleted by the rollback of the deploy that created
    it (a resource after it fails: here a bucket whose name is taken)."""
    cf, s3 = aws["cloudformation"], aws["s3"]
    s3.create_bucket(Bucket="taken-after-fsx-482913650271", CreateBucketConfiguration={"LocationConstraint": "ap-southeast-3"})
    project, _, deployed = flagship
    body = json.loads(json.dumps(build_infra_template(project)["Resources"][fsx_logical_id(created_fsx(project)[0].name)]))
    body.pop("DependsOn")
    body["Properties"].update(SubnetIds=[outputs(deployed)["PrivateSubnetId"]],
                              SecurityGroupIds=[physical(cf, "p5e-80x7-infra", "FsxSecurityGroup")])
    template = {"Resources": {"Fs": body, "After": {"Type": "AWS::S3::Bucket", "DependsOn": "Fs",
                                                    "Properties": {"BucketName": "taken-after-fsx-482913650271"}}}}
    assert body["DeletionPolicy"] == "RetainExceptOnCreate"
    made = cf.create_change_set(StackName="fsx-rollback", ChangeSetName="c", ChangeSetType="CREATE",
                                TemplateBody=json.dumps(template))
    cf.execute_change_set(ChangeSetName="c", StackName="fsx-rollback")
    assert wait(cf, made["StackId"])["StackStatus"] == "ROLLBACK_COMPLETE"
    seen = events(cf, "fsx-rollback")
    fs_id = next(e["PhysicalResourceId"] for e in seen if (e["LogicalResourceId"], e["ResourceStatus"]) == ("Fs", "CREATE_COMPLETE"))
    assert {e["LogicalResourceId"]: e["ResourceStatus"] for e in seen}["Fs"] == "DELETE_COMPLETE"
    assert error_code(lambda: aws["fsx"].describe_file_systems(FileSystemIds=[fs_id])) == "FileSystemNotFound"
