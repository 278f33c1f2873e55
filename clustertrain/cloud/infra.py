"""CloudFormation template for what the cluster stands on: VPC, subnets, NAT, security groups,
S3 buckets for data and checkpoints, the least-privilege IAM policy the nodes get (``StoragePolicy``,
output ``StoragePolicyArn`` -> ``aws.storage_policy_arn`` -> ``AdditionalIamPolicies`` of the head node and every queue),
and the FSx for Lustre file systems of ``aws.fsx`` that name no ``file_system_id``.

Why the stack creates the file systems and not ParallelCluster: ParallelCluster creates at most one new FSx per cluster
(``MAX_NEW_STORAGE_COUNT`` in pcluster/constants.py, its NumberOfStorageValidator) and up to 20 existing ones can be
mounted by id; a file system in this stack also outlives a deleted cluster (the pattern of aws-samples'
awsome-distributed-training, whose prerequisites stack holds the VPC and the FSx). Each is ``Fsx<Name>``
(:func:`clustertrain.cloud.state.fsx_logical_id`), in the private subnet, Lustre 2.15 (what ParallelCluster 3.16
creates), made after the buckets and the policy, with output ``Fsx<Name>Id`` that the cluster config mounts. Their security group
``FsxSecurityGroup`` takes all traffic from the head node's and compute groups and from itself, as the group
ParallelCluster makes for a file system it creates (``_add_storage_security_group`` in pcluster/templates/cluster_stack.py);
the nodes' groups keep their default allow-all egress.

Built as a dict (long-form intrinsics: ``{"Ref": ...}``, ``{"Fn::GetAtt": [...]}``) and dumped as
YAML. No account id appears: ARNs use ``${AWS::Partition}`` and bucket names. Deploy with
``aws cloudformation deploy --template-file infra.yaml --stack-name NAME --capabilities CAPABILITY_IAM``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from clustertrain.cloud.pcluster import dump_yaml
from clustertrain.cloud.project_rules import bucket_of, checkpoint_bucket, data_bucket, prefix_of, require_aws, scripts_uri
from clustertrain.cloud.state import fsx_logical_id, fsx_output
from clustertrain.core.errors import ConfigError

if TYPE_CHECKING:
    from clustertrain.project import Project


#: DeletionPolicy of what holds data (buckets, file systems): kept by a stack delete, deleted by the rollback of the
#: deploy that created it (a failed first deploy leaves nothing behind); a replacement keeps the old one
#: (UpdateReplacePolicy: Retain). https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/aws-attribute-deletionpolicy.html
KEEP = "RetainExceptOnCreate"
#: the DeletionPolicy values a stack delete keeps
KEPT_POLICIES = ("Retain", "RetainExceptOnCreate")


def kept_resources(template: dict[str, Any]) -> list[str]:
    """The logical ids of ``template`` that a stack delete keeps (:data:`KEPT_POLICIES`)."""
    return [k for k, r in (template.get("Resources") or {}).items() if r.get("DeletionPolicy") in KEPT_POLICIES]


def _ref(name: str) -> dict[str, str]:
    return {"Ref": name}


def _att(name: str, attr: str) -> dict[str, list[str]]:
    return {"Fn::GetAtt": [name, attr]}


def _file_systems(project: "Project", r: dict[str, Any], outputs: dict[str, Any], tagged: Any) -> None:
    """The FSx for Lustre file systems the stack creates (see the module docstring), their security group and outputs."""
    aws = require_aws(project)
    created = [f for f in aws.fsx if f.file_system_id is None]
    if not created:
        return
    names: dict[str, str] = {}
    for f in created:
        logical = fsx_logical_id(f.name)
        if logical in names:
            raise ConfigError(f"aws.fsx: the names {names[logical]!r} and {f.name!r} both make the template's logical id "
                              f"{logical}; rename one (letters and digits differ, not only '-' and '_')")
        names[logical] = f.name
    r["FsxSecurityGroup"] = {"Type": "AWS::EC2::SecurityGroup", "Properties": {
        "GroupDescription": f"{project.name} FSx for Lustre: all traffic from the head node, compute and the file servers",
        "VpcId": _ref("Vpc"), "Tags": tagged("fsx")}}
    for name, source in (("FsxFromHead", "HeadNodeSecurityGroup"), ("FsxFromCompute", "ComputeSecurityGroup"),
                         ("FsxFromFsx", "FsxSecurityGroup")):
        r[name] = {"Type": "AWS::EC2::SecurityGroupIngress", "Properties": {
            "GroupId": _att("FsxSecurityGroup", "GroupId"), "SourceSecurityGroupId": _att(source, "GroupId"), "IpProtocol": "-1",
            "Description": f"all traffic (Lustre: TCP 988) from {source}"}}
    for f in created:
        lustre: dict[str, Any] = {"DeploymentType": f.deployment_type}
        if f.effective_throughput is not None:
            lustre["PerUnitStorageThroughput"] = f.effective_throughput
        if f.compression == "LZ4":
            lustre["DataCompressionType"] = "LZ4"
        logical = fsx_logical_id(f.name)
        # made last (a taken bucket name fails the deploy in seconds, before any file system is paid for); kept by a
        # stack delete or a replacement, deleted by the rollback of the deploy that created it
        r[logical] = {"Type": "AWS::FSx::FileSystem", "DeletionPolicy": KEEP, "UpdateReplacePolicy": "Retain",
                      "DependsOn": ["FsxFromHead", "FsxFromCompute", "FsxFromFsx", "DataBucket", "CheckpointBucket",
                                    "StoragePolicy"], "Properties": {
                          "FileSystemType": "LUSTRE", "FileSystemTypeVersion": "2.15", "StorageType": "SSD",
                          "StorageCapacity": f.capacity_gb, "SubnetIds": [_ref("PrivateSubnet")],
                          "SecurityGroupIds": [_att("FsxSecurityGroup", "GroupId")], "LustreConfiguration": lustre,
                          "Tags": tagged(f.name)}}
        outputs[fsx_output(f.name)] = {"Value": _ref(logical), "Description": f"aws.fsx {f.name} ({f.mount_dir}): its FileSystemId"}


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
        # fixed text: GroupDescription is create-only, so a description naming ssh_cidr would replace the group (and its id
        # under the running head node) on every change of that CIDR; the rule itself carries it
        "GroupDescription": f"{project.name} head node: SSH from aws.network.ssh_cidr only, all from compute",
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

    outputs: dict[str, Any] = {}
    _file_systems(project, r, outputs, tagged)
    outputs |= {
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
        raise ConfigError(f"aws.buckets: data and checkpoints are both {data!r}; use two buckets (datasets and checkpoints have their own lifetimes and write rules)")
    # Both buckets are versioned: the node role may overwrite and delete under its own prefixes (a sync rewrites its
    # manifest; `--delete` removes files), so old versions are the undo; they expire after 30 days.
    for logical, name in (("DataBucket", data), ("CheckpointBucket", ckpt)):
        props: dict[str, Any] = {
            "BucketName": name,
            "PublicAccessBlockConfiguration": {"BlockPublicAcls": True, "BlockPublicPolicy": True,
                                               "IgnorePublicAcls": True, "RestrictPublicBuckets": True},
            "BucketEncryption": {"ServerSideEncryptionConfiguration": [
                {"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}, "BucketKeyEnabled": True}]},
            "OwnershipControls": {"Rules": [{"ObjectOwnership": "BucketOwnerEnforced"}]},
            "VersioningConfiguration": {"Status": "Enabled"},
            "Tags": tagged(logical),
        }
        props["LifecycleConfiguration"] = {"Rules": [{"Id": "expire-old-versions", "Status": "Enabled",
                                                      "NoncurrentVersionExpiration": {"NoncurrentDays": 30},
                                                      "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 7}}]}
        r[logical] = {"Type": "AWS::S3::Bucket", "DeletionPolicy": KEEP, "UpdateReplacePolicy": "Retain",
                      "Properties": props}
        r[f"{logical}Policy"] = {"Type": "AWS::S3::BucketPolicy", "Properties": {
            "Bucket": _ref(logical),
            "PolicyDocument": {"Version": "2012-10-17", "Statement": [{
                "Sid": "DenyInsecureTransport", "Effect": "Deny", "Principal": "*", "Action": "s3:*",
                "Resource": [_att(logical, "Arn"), {"Fn::Sub": f"${{{logical}.Arn}}/*"}],
                "Condition": {"Bool": {"aws:SecureTransport": "false"}}}]}}}
        outputs[f"{logical}Name"] = {"Value": _ref(logical), "Description": f"{logical} name"}

    policy = storage_policy_document(project)
    for st in policy["Statement"]:
        st["Resource"] = [{"Fn::Sub": arn} for arn in st["Resource"]]
    r["StoragePolicy"] = {"Type": "AWS::IAM::ManagedPolicy", "Properties": {
        "Description": f"{project.name} nodes: exactly the S3 calls clustertrain makes (see clustertrain/cloud/infra.py)",
        "PolicyDocument": policy}}
    outputs["StoragePolicyArn"] = {"Value": _ref("StoragePolicy"), "Description": "aws.storage_policy_arn"}

    return {
        "AWSTemplateFormatVersion": "2010-09-09",
        "Description": f"clustertrain infrastructure for project {project.name}",
        "Parameters": {"AvailabilityZone": {
            "Type": "AWS::EC2::AvailabilityZone::Name", "Default": aws.availability_zone,
            "Description": "Zone of both subnets (and of FSx and the ODCR); from aws.availability_zone"}},
        "Resources": r,
        "Outputs": outputs,
    }


#: what each storage call of clustertrain.storage.S3Store needs (moto and AWS name them the same)
S3_CALLS = {
    "list_objects_v2": "s3:ListBucket",
    "list_multipart_uploads": "s3:ListBucketMultipartUploads",
    "head_object / get_object / download_file": "s3:GetObject",
    "put_object / upload_file (incl. CreateMultipartUpload, UploadPart, CompleteMultipartUpload)": "s3:PutObject",
    "list_parts (multipart transfers)": "s3:ListMultipartUploadParts",
    "abort_multipart_upload": "s3:AbortMultipartUpload",
    "delete_objects (old manifest, --delete)": "s3:DeleteObject",
}
RW_ACTIONS = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"]


def storage_policy_document(project: "Project", partition: str = "${AWS::Partition}") -> dict[str, Any]:
    """The IAM policy the nodes get (aws.storage_policy_arn): read the data bucket; read, write and delete only under
    our own prefixes — the checkpoint backups (storage.checkpoint_bucket), the published datasets (storage.data_bucket);
    read the node scripts. Bucket-level: list and list multipart uploads. Nothing else: no bucket policy, versions,
    lifecycle or bucket deletion. ``partition="aws"`` gives plain ARNs (the moto test creates a user with it)."""
    data, ckpt = data_bucket(project), checkpoint_bucket(project)
    if data is None or ckpt is None:
        raise ConfigError("set aws.buckets.data and aws.buckets.checkpoints (or storage.data_bucket / storage.checkpoint_bucket as s3:// URIs)")

    def arn(bucket: str, prefix: str | None = None) -> str:
        base = f"arn:{partition}:s3:::{bucket}"
        return base if prefix is None else f"{base}/{prefix + '/' if prefix else ''}*"

    # both set: the project derives them from aws.buckets (Project._derive_storage) when the file does not
    ckpt_uri, publish_uri = project.storage.checkpoint_bucket, project.storage.data_bucket
    writable = [(bucket_of(ckpt_uri) or ckpt, prefix_of(ckpt_uri)), (bucket_of(publish_uri) or data, prefix_of(publish_uri))]
    scripts = scripts_uri(project)
    buckets = list(dict.fromkeys([data, ckpt] + [b for b, _ in writable]))
    statements: list[dict[str, Any]] = [
        {"Sid": "ListOurBuckets", "Effect": "Allow", "Action": ["s3:ListBucket", "s3:ListBucketMultipartUploads"],
         "Resource": [arn(b) for b in buckets]},
        {"Sid": "ReadData", "Effect": "Allow", "Action": ["s3:GetObject"], "Resource": [arn(data, "")]},
        {"Sid": "CheckpointBackups", "Effect": "Allow", "Action": list(RW_ACTIONS), "Resource": [arn(*writable[0])]},
        {"Sid": "PublishDatasets", "Effect": "Allow", "Action": list(RW_ACTIONS), "Resource": [arn(*writable[1])]},
    ]
    if bucket_of(scripts) != data:
        statements.append({"Sid": "ReadNodeScripts", "Effect": "Allow", "Action": ["s3:GetObject"],
                           "Resource": [arn(bucket_of(scripts) or data, prefix_of(scripts))]})
    return {"Version": "2012-10-17", "Statement": statements}


def render_infra_template(template: dict[str, Any], project_name: str) -> str:
    header = (
        f"# CloudFormation template for project {project_name!r}, generated by clustertrain (clustertrain cluster infra).\n"
        "# Check: cfn-lint THIS_FILE\n"
        "# Deploy: aws cloudformation deploy --template-file THIS_FILE --stack-name NAME --capabilities CAPABILITY_IAM\n"
    )
    return header + dump_yaml(template)
