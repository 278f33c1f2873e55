"""CloudFormation template for what the cluster stands on: VPC, subnets, NAT, security groups,
S3 buckets for data and checkpoints, and a least-privilege IAM policy for compute nodes.

Built as a dict (long-form intrinsics: ``{"Ref": ...}``, ``{"Fn::GetAtt": [...]}``) and dumped as
YAML. No account id appears: ARNs use ``${AWS::Partition}`` and bucket names. Deploy with
``aws cloudformation deploy --template-file infra.yaml --stack-name NAME --capabilities CAPABILITY_IAM``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from clustertrain.cloud.pcluster import bucket_of, checkpoint_bucket, data_bucket, dump_yaml, require_aws, scripts_uri
from clustertrain.errors import ConfigError

if TYPE_CHECKING:
    from clustertrain.project import Project


def _ref(name: str) -> dict[str, str]:
    return {"Ref": name}


def _att(name: str, attr: str) -> dict[str, list[str]]:
    return {"Fn::GetAtt": [name, attr]}


def build_infra_template(project: "Project") -> dict[str, Any]:
    aws = require_aws(project)
    if aws.availability_zone is None:
        raise ConfigError(f"aws.availability_zone is missing; set it to one zone of {aws.region}, e.g. {aws.region}a (use the zone of your ODCR)")
    net = aws.network
    tags = [{"Key": "clustertrain:project", "Value": project.name}] + [{"Key": k, "Value": v} for k, v in aws.tags.items()]

    def tagged(name: str) -> list[dict[str, Any]]:
        return [{"Key": "Name", "Value": f"{project.name}-{name}"}] + tags

    r: dict[str, Any] = {}
    r["Vpc"] = {"Type": "AWS::EC2::VPC", "Properties": {
        "CidrBlock": net.vpc_cidr, "EnableDnsSupport": True, "EnableDnsHostnames": True, "Tags": tagged("vpc")}}
    r["InternetGateway"] = {"Type": "AWS::EC2::InternetGateway", "Properties": {"Tags": tagged("igw")}}
    r["GatewayAttachment"] = {"Type": "AWS::EC2::VPCGatewayAttachment", "Properties": {
        "VpcId": _ref("Vpc"), "InternetGatewayId": _ref("InternetGateway")}}
    r["PublicSubnet"] = {"Type": "AWS::EC2::Subnet", "Properties": {
        "VpcId": _ref("Vpc"), "CidrBlock": net.public_subnet_cidr, "AvailabilityZone": _ref("AvailabilityZone"),
        "MapPublicIpOnLaunch": True, "Tags": tagged("public")}}
    r["PrivateSubnet"] = {"Type": "AWS::EC2::Subnet", "Properties": {
        "VpcId": _ref("Vpc"), "CidrBlock": net.private_subnet_cidr, "AvailabilityZone": _ref("AvailabilityZone"),
        "MapPublicIpOnLaunch": False, "Tags": tagged("private")}}
    r["NatEip"] = {"Type": "AWS::EC2::EIP", "DependsOn": "GatewayAttachment", "Properties": {"Domain": "vpc", "Tags": tagged("nat")}}
    r["NatGateway"] = {"Type": "AWS::EC2::NatGateway", "Properties": {
        "AllocationId": _att("NatEip", "AllocationId"), "SubnetId": _ref("PublicSubnet"), "Tags": tagged("nat")}}
    r["PublicRouteTable"] = {"Type": "AWS::EC2::RouteTable", "Properties": {"VpcId": _ref("Vpc"), "Tags": tagged("public")}}
    r["PublicDefaultRoute"] = {"Type": "AWS::EC2::Route", "DependsOn": "GatewayAttachment", "Properties": {
        "RouteTableId": _ref("PublicRouteTable"), "DestinationCidrBlock": "0.0.0.0/0", "GatewayId": _ref("InternetGateway")}}
    r["PublicSubnetRoutes"] = {"Type": "AWS::EC2::SubnetRouteTableAssociation", "Properties": {
        "SubnetId": _ref("PublicSubnet"), "RouteTableId": _ref("PublicRouteTable")}}
    r["PrivateRouteTable"] = {"Type": "AWS::EC2::RouteTable", "Properties": {"VpcId": _ref("Vpc"), "Tags": tagged("private")}}
    r["PrivateDefaultRoute"] = {"Type": "AWS::EC2::Route", "Properties": {
        "RouteTableId": _ref("PrivateRouteTable"), "DestinationCidrBlock": "0.0.0.0/0", "NatGatewayId": _ref("NatGateway")}}
    r["PrivateSubnetRoutes"] = {"Type": "AWS::EC2::SubnetRouteTableAssociation", "Properties": {
        "SubnetId": _ref("PrivateSubnet"), "RouteTableId": _ref("PrivateRouteTable")}}
    # S3 traffic (datasets, checkpoints) stays off the NAT gateway: a free gateway endpoint.
    r["S3Endpoint"] = {"Type": "AWS::EC2::VPCEndpoint", "Properties": {
        "VpcId": _ref("Vpc"), "VpcEndpointType": "Gateway", "ServiceName": {"Fn::Sub": "com.amazonaws.${AWS::Region}.s3"},
        "RouteTableIds": [_ref("PrivateRouteTable"), _ref("PublicRouteTable")]}}

    head_ingress = []
    if net.ssh_cidr:
        head_ingress.append({"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "CidrIp": net.ssh_cidr,
                             "Description": "SSH from the configured CIDR only"})
    r["HeadNodeSecurityGroup"] = {"Type": "AWS::EC2::SecurityGroup", "Properties": {
        "GroupDescription": f"{project.name} head node: SSH from {net.ssh_cidr or 'nowhere (Session Manager)'}, all from compute",
        "VpcId": _ref("Vpc"), "SecurityGroupIngress": head_ingress, "Tags": tagged("head")}}
    r["ComputeSecurityGroup"] = {"Type": "AWS::EC2::SecurityGroup", "Properties": {
        "GroupDescription": f"{project.name} compute nodes: all traffic within the group (EFA) and from the head node",
        "VpcId": _ref("Vpc"), "Tags": tagged("compute")}}
    rules = {
        "ComputeFromCompute": ("ComputeSecurityGroup", "ComputeSecurityGroup", "all traffic within the compute group (EFA, NCCL)"),
        "ComputeFromHead": ("ComputeSecurityGroup", "HeadNodeSecurityGroup", "head node to compute (slurmd, NFS clients)"),
        "HeadFromCompute": ("HeadNodeSecurityGroup", "ComputeSecurityGroup", "compute to head node (slurmctld, NFS)"),
    }
    for name, (group, source, why) in rules.items():
        r[name] = {"Type": "AWS::EC2::SecurityGroupIngress", "Properties": {
            "GroupId": _att(group, "GroupId"), "SourceSecurityGroupId": _att(source, "GroupId"), "IpProtocol": "-1", "Description": why}}
    # EFA needs an outbound rule to its own group; the group's default allow-all egress stays as well.
    r["ComputeToCompute"] = {"Type": "AWS::EC2::SecurityGroupEgress", "Properties": {
        "GroupId": _att("ComputeSecurityGroup", "GroupId"), "DestinationSecurityGroupId": _att("ComputeSecurityGroup", "GroupId"),
        "IpProtocol": "-1", "Description": "all traffic within the compute group (EFA)"}}

    outputs: dict[str, Any] = {
        "VpcId": {"Value": _ref("Vpc"), "Description": "VPC id"},
        "PublicSubnetId": {"Value": _ref("PublicSubnet"), "Description": "aws.network.public_subnet_id (head node)"},
        "PrivateSubnetId": {"Value": _ref("PrivateSubnet"), "Description": "aws.network.private_subnet_id (compute, FSx)"},
        "HeadNodeSecurityGroupId": {"Value": _att("HeadNodeSecurityGroup", "GroupId"), "Description": "aws.network.head_security_group_id"},
        "ComputeSecurityGroupId": {"Value": _att("ComputeSecurityGroup", "GroupId"), "Description": "aws.network.compute_security_group_id"},
    }

    data, ckpt = data_bucket(project), checkpoint_bucket(project)
    if data is None or ckpt is None:
        raise ConfigError("set aws.buckets.data and aws.buckets.checkpoints (or storage.data_bucket / storage.checkpoint_bucket as s3:// URIs)")
    if data == ckpt:
        raise ConfigError(f"aws.buckets: data and checkpoints are both {data!r}; use two buckets (only the checkpoint bucket is writable and versioned)")
    for logical, name, versioned in (("DataBucket", data, False), ("CheckpointBucket", ckpt, True)):
        props: dict[str, Any] = {
            "BucketName": name,
            "PublicAccessBlockConfiguration": {"BlockPublicAcls": True, "BlockPublicPolicy": True,
                                               "IgnorePublicAcls": True, "RestrictPublicBuckets": True},
            "BucketEncryption": {"ServerSideEncryptionConfiguration": [
                {"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}, "BucketKeyEnabled": True}]},
            "OwnershipControls": {"Rules": [{"ObjectOwnership": "BucketOwnerEnforced"}]},
            "VersioningConfiguration": {"Status": "Enabled" if versioned else "Suspended"},
            "Tags": tagged(logical),
        }
        if versioned:
            props["LifecycleConfiguration"] = {"Rules": [{"Id": "expire-old-versions", "Status": "Enabled",
                                                          "NoncurrentVersionExpiration": {"NoncurrentDays": 30},
                                                          "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 7}}]}
        r[logical] = {"Type": "AWS::S3::Bucket", "DeletionPolicy": "Retain", "UpdateReplacePolicy": "Retain", "Properties": props}
        r[f"{logical}Policy"] = {"Type": "AWS::S3::BucketPolicy", "Properties": {
            "Bucket": _ref(logical),
            "PolicyDocument": {"Version": "2012-10-17", "Statement": [{
                "Sid": "DenyInsecureTransport", "Effect": "Deny", "Principal": "*", "Action": "s3:*",
                "Resource": [_att(logical, "Arn"), {"Fn::Sub": f"${{{logical}.Arn}}/*"}],
                "Condition": {"Bool": {"aws:SecureTransport": "false"}}}]}}}
        outputs[f"{logical}Name"] = {"Value": _ref(logical), "Description": f"{logical} name"}

    statements: list[dict[str, Any]] = [
        {"Sid": "ListBuckets", "Effect": "Allow", "Action": ["s3:ListBucket", "s3:GetBucketLocation"],
         "Resource": [_att("DataBucket", "Arn"), _att("CheckpointBucket", "Arn")]},
        {"Sid": "ReadData", "Effect": "Allow", "Action": ["s3:GetObject"], "Resource": [{"Fn::Sub": "${DataBucket.Arn}/*"}]},
        {"Sid": "WriteCheckpoints", "Effect": "Allow",
         "Action": ["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"],
         "Resource": [{"Fn::Sub": "${CheckpointBucket.Arn}/*"}]},
    ]
    scripts_bucket = bucket_of(scripts_uri(project))
    if scripts_bucket not in (data, ckpt):
        statements.append({"Sid": "ReadNodeScripts", "Effect": "Allow", "Action": ["s3:GetObject"],
                           "Resource": [{"Fn::Sub": f"arn:${{AWS::Partition}}:s3:::{scripts_bucket}/*"}]})
    r["ComputeNodePolicy"] = {"Type": "AWS::IAM::ManagedPolicy", "Properties": {
        "Description": f"{project.name} compute nodes: read the data bucket, write the checkpoint bucket",
        "PolicyDocument": {"Version": "2012-10-17", "Statement": statements}}}
    outputs["ComputeNodePolicyArn"] = {"Value": _ref("ComputeNodePolicy"), "Description": "add to aws.additional_iam_policies"}

    return {
        "AWSTemplateFormatVersion": "2010-09-09",
        "Description": f"clustertrain infrastructure for project {project.name}",
        "Parameters": {"AvailabilityZone": {
            "Type": "AWS::EC2::AvailabilityZone::Name", "Default": aws.availability_zone,
            "Description": "Zone of both subnets (and of FSx and the ODCR); from aws.availability_zone"}},
        "Resources": r,
        "Outputs": outputs,
    }


def render_infra_template(template: dict[str, Any], project_name: str) -> str:
    header = (
        f"# CloudFormation template for project {project_name!r}, generated by clustertrain (clustertrain cluster infra).\n"
        "# Check: cfn-lint THIS_FILE\n"
        "# Deploy: aws cloudformation deploy --template-file THIS_FILE --stack-name NAME --capabilities CAPABILITY_IAM\n"
    )
    return header + dump_yaml(template)
