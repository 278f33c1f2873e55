"""Fixes to how moto's CloudFormation applies and updates the properties of resource types of our template
(moto 5.2.5; file:line are of that release): S3 buckets, EC2 security groups, IAM managed policies; FSx file systems
(:mod:`tests.support.moto_fsx`). Applied by :func:`tests.support.moto_cfn_server.apply_fixes` in the server process
only; :data:`UPDATES` is read by its update hook (``fix_resource_events``) through :func:`create_only_changed`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from moto.ec2.models import ec2_backends
from moto.iam.models import iam_backends
from moto.s3.models import s3_backends
from moto.utilities.utils import get_partition

from tests.support.moto_fsx import FSX_CREATE_ONLY, update_file_system


def _lifecycle_rule(rule: dict[str, Any]) -> dict[str, Any]:
    """One CloudFormation LifecycleConfiguration rule as S3's API (PutBucketLifecycleConfiguration) has it."""
    api: dict[str, Any] = {"ID": rule.get("Id"), "Status": rule["Status"], "Filter": {"Prefix": rule.get("Prefix", "")}}
    if "ExpirationInDays" in rule or "ExpiredObjectDeleteMarker" in rule:
        api["Expiration"] = {"Days": rule["ExpirationInDays"]} if "ExpirationInDays" in rule \
            else {"ExpiredObjectDeleteMarker": rule["ExpiredObjectDeleteMarker"]}
    if "NoncurrentVersionExpirationInDays" in rule:
        api["NoncurrentVersionExpiration"] = {"NoncurrentDays": rule["NoncurrentVersionExpirationInDays"]}
    for key in ("NoncurrentVersionExpiration", "AbortIncompleteMultipartUpload"):
        if key in rule:
            api[key] = rule[key]
    if "Transitions" in rule:
        api["Transition"] = [{"Days": t.get("TransitionInDays"), "Date": t.get("TransitionDate"),
                              "StorageClass": t["StorageClass"]} for t in rule["Transitions"]]
    return api


def fix_bucket_properties() -> None:
    """An AWS::S3::Bucket gets its versioning, public access block, ownership controls and lifecycle rules.

    moto: ``FakeBucket.create_from_cloudformation_json`` / ``update_from_cloudformation_json``
    (s3/models.py:1539, 1565) apply only BucketEncryption and Tags; the other properties are ignored.
    CloudFormation: applies every property of the template
    (https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/aws-resource-s3-bucket.html).
    Here: VersioningConfiguration, PublicAccessBlockConfiguration, OwnershipControls and LifecycleConfiguration
    (Id, Status, Prefix, ExpirationInDays, NoncurrentVersionExpiration[InDays], AbortIncompleteMultipartUpload,
    Transitions) are put through moto's S3 backend after moto's own code.
    """
    from moto.s3.models import FakeBucket

    original_create = FakeBucket.create_from_cloudformation_json.__func__
    original_update = FakeBucket.update_from_cloudformation_json.__func__

    def configure(bucket: Any, props: dict[str, Any], account_id: str, region_name: str) -> Any:
        backend = s3_backends[account_id][get_partition(region_name)]
        if "VersioningConfiguration" in props:
            backend.put_bucket_versioning(bucket.name, props["VersioningConfiguration"]["Status"])
        if "PublicAccessBlockConfiguration" in props:
            backend.put_public_access_block(
                bucket.name, {k: str(v).lower() for k, v in props["PublicAccessBlockConfiguration"].items()})
        if props.get("OwnershipControls", {}).get("Rules"):
            backend.put_bucket_ownership_controls(bucket.name, props["OwnershipControls"]["Rules"][0]["ObjectOwnership"])
        if "LifecycleConfiguration" in props:
            backend.put_bucket_lifecycle(bucket.name, [_lifecycle_rule(r) for r in props["LifecycleConfiguration"]["Rules"]])
        return bucket

    def create(cls: type, resource_name: str, cloudformation_json: Any, account_id: str, region_name: str,
               **kwargs: Any) -> Any:
        bucket = original_create(cls, resource_name, cloudformation_json, account_id, region_name, **kwargs)
        return configure(bucket, cloudformation_json.get("Properties", {}), account_id, region_name)

    def update(cls: type, original_resource: Any, new_resource_name: str, cloudformation_json: Any,
               account_id: str, region_name: str) -> Any:
        bucket = original_update(cls, original_resource, new_resource_name, cloudformation_json, account_id, region_name)
        return configure(bucket, cloudformation_json.get("Properties", {}), account_id, region_name)

    FakeBucket.create_from_cloudformation_json = classmethod(create)
    FakeBucket.update_from_cloudformation_json = classmethod(update)


def _authorize_inline(ec2: Any, group: Any, props: dict[str, Any]) -> list[str]:
    """The group's ``SecurityGroupIngress`` property, authorized as moto's create does (security_groups.py:290),
    with each rule's Description; returns the ids of the rules added."""
    before = {rule.id for rule in group.ingress_rules}
    for rule in props.get("SecurityGroupIngress", []):
        source = {k: rule[f"SourceSecurityGroup{k[5:]}"] for k in ("GroupId", "GroupName")
                  if f"SourceSecurityGroup{k[5:]}" in rule}
        ranges = [{"CidrIp": rule["CidrIp"], "Description": rule.get("Description")}] if "CidrIp" in rule else []
        ec2.authorize_security_group_ingress(group.id, str(rule["IpProtocol"]), rule.get("FromPort"),
                                             rule.get("ToPort"), ranges, source_groups=[source] if source else [],
                                             vpc_id=group.vpc_id)
    return [rule.id for rule in group.ingress_rules if rule.id not in before]


def fix_security_group_update() -> None:
    """A security group whose ingress rules or tags change is updated in place, keeping its id.

    moto: ``SecurityGroup.update_from_cloudformation_json`` (ec2/models/security_groups.py:337) deletes the group
    and creates a new one for any change (a new id; the rules other groups have on the old id dangle).
    CloudFormation: SecurityGroupIngress, SecurityGroupEgress and Tags are updated with no interruption; only
    GroupDescription, GroupName or VpcId replace the group -- new group first, dependents updated, old group
    deleted at cleanup (:data:`UPDATES` sends those to moto_cfn_resources.update_unupdatable)
    (https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/aws-resource-ec2-securitygroup.html).
    Here: the group remembers the ids of its inline ingress rules; an update revokes those, authorizes the new ones
    and retags.
    """
    from moto.ec2.models.security_groups import SecurityGroup

    original_create = SecurityGroup.create_from_cloudformation_json.__func__
    original_update = SecurityGroup.update_from_cloudformation_json.__func__

    def create(cls: type, resource_name: str, cloudformation_json: Any, account_id: str, region_name: str,
               **kwargs: Any) -> Any:
        group = original_create(cls, resource_name, cloudformation_json, account_id, region_name, **kwargs)
        group._ct_inline = [rule.id for rule in group.ingress_rules]
        return group

    def update(cls: type, original_resource: Any, new_resource_name: str, cloudformation_json: Any,
               account_id: str, region_name: str) -> Any:
        old, new = getattr(original_resource, "_ct_props", None), cloudformation_json["Properties"]
        if old is None or create_only_changed("AWS::EC2::SecurityGroup", old, new):
            return original_update(cls, original_resource, new_resource_name, cloudformation_json, account_id, region_name)
        ec2, group = ec2_backends[account_id][region_name], original_resource
        if getattr(group, "_ct_inline", None):
            ec2.revoke_security_group_ingress(group.id, None, None, None, [], security_rule_ids=group._ct_inline)
        group._ct_inline = _authorize_inline(ec2, group, new)
        old_tags = {t["Key"] for t in old.get("Tags", [])} - {t["Key"] for t in new.get("Tags", [])}
        ec2.delete_tags([group.id], dict.fromkeys(old_tags))
        ec2.create_tags([group.id], {t["Key"]: t["Value"] for t in new.get("Tags", [])})
        return group

    SecurityGroup.create_from_cloudformation_json = classmethod(create)
    SecurityGroup.update_from_cloudformation_json = classmethod(update)


def _new_policy_version(policy: Any, props: dict[str, Any], account_id: str, region_name: str) -> None:
    """AWS::IAM::ManagedPolicy's PolicyDocument, updated in place: a new default version, the old ones deleted
    (moto's ManagedPolicy, iam/models.py:353, has no CloudFormation update at all)."""
    iam = iam_backends[account_id][get_partition(region_name)]
    iam.create_policy_version(policy.arn, json.dumps(props["PolicyDocument"]), set_as_default=True)
    for version in list(policy.versions):
        if not version.is_default:
            iam.delete_policy_version(policy.arn, version.version_id)


#: CloudFormation type -> (its create-only properties: a change replaces the resource; ``A.B`` is key B of property
#: A; how the other properties are updated in place, None: by moto's model). From the "Update requires" of each
#: property in the CloudFormation template reference (e.g. .../TemplateReference/aws-resource-iam-managedpolicy.html).
#: Types not listed: moto's model updates them, or, if it has no update, any change but Tags replaces them
#: (moto_cfn_resources.fix_replacement).
UPDATES: dict[str, tuple[tuple[str, ...], Callable[[Any, dict[str, Any], str, str], None] | None]] = {
    "AWS::EC2::SecurityGroup": (("GroupDescription", "GroupName", "VpcId"), None),
    "AWS::IAM::ManagedPolicy": (("ManagedPolicyName", "Path", "Description"), _new_policy_version),
    "AWS::FSx::FileSystem": (FSX_CREATE_ONLY, update_file_system),
}


def _at(props: Any, path: str) -> Any:
    for key in path.split("."):
        props = props.get(key) if isinstance(props, dict) else None
    return props


def create_only_changed(resource_type: str, old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Whether a create-only property of ``resource_type`` (:data:`UPDATES`) differs between two property sets."""
    return any(_at(old, path) != _at(new, path) for path in UPDATES.get(resource_type, ((), None))[0])
