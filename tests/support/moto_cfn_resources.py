"""Resource-level fixes to moto's CloudFormation (moto 5.2.5; file:line are of that release), and the helpers the
stack-level fixes in :mod:`tests.support.moto_cfn_server` share. Only that server process imports this module: it
patches moto classes when :func:`fix_missing_resources` / :func:`fix_replacement` run, never at import.

Events: every fix records what CloudFormation would show in DescribeStackEvents, through :func:`event`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from moto.cloudformation import models as M
from moto.cloudformation import parsing as P
from moto.core.common_models import CloudFormationModel
from moto.ec2.models import ec2_backends
from moto.ec2.models.core import TaggedEC2Resource
from moto.ec2.models.security_groups import SecurityGroupIngress
from moto.ec2.models.subnets import SubnetRouteTableAssociation
from moto.iam.models import iam_backends
from moto.s3.models import s3_backends
from moto.utilities.utils import get_partition


def reason(exc: BaseException) -> str:
    code = getattr(exc, "error_type", "") or getattr(exc, "code", "") or type(exc).__name__
    return f"{code}: {getattr(exc, 'message', '') or exc}"


def physical_id(resource: Any) -> str:
    try:
        return str(getattr(resource, "physical_resource_id", "") or "")
    except Exception:  # some moto models compute it from state that may be gone
        return ""


def stack_of(resource_map: P.ResourceMap) -> Any:
    """The Stack owning a resource map (set by tests.support.moto_cfn_server.fix_resource_events)."""
    return getattr(resource_map, "_ct_stack", None)


def event(stack: Any, logical_id: str, resource_type: str, status: str, physical: str = "",
          why: str | None = None) -> None:
    if stack is None:
        return
    item = M.Event(stack_id=stack.stack_id, stack_name=stack.name, logical_resource_id=logical_id,
                   physical_resource_id=physical, resource_type=resource_type, resource_status=status,
                   resource_status_reason=why, resource_properties=None)
    item.sendToSns(stack.account_id, stack.region_name, stack.notification_arns)
    stack.events.append(item)


def failed(stack: Any, logical_id: str, exc: BaseException) -> None:
    """Record that ``logical_id`` failed in the stack's current operation (``stack._ct_failed``, reset by each)."""
    if stack is not None:
        stack._ct_failed = {**getattr(stack, "_ct_failed", {}), logical_id: exc}


def failed_before(stack: Any, logical_id: str) -> None:
    """Raise the resource's error again if it failed already in this operation: moto retries failed updates and
    deletes (parsing.py:840, 877) for ordering, which only repeats events here (dependencies come first)."""
    exc = getattr(stack, "_ct_failed", {}).get(logical_id)
    if exc is not None:
        raise exc


def references(node: Any) -> set[str]:
    """Logical ids a template fragment uses: Ref, Fn::GetAtt, Fn::Sub ``${Name}`` / ``${Name.Attr}``."""
    found: set[str] = set()
    if isinstance(node, list):
        for item in node:
            found |= references(item)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key == "Ref" and isinstance(value, str):
                found.add(value)
            elif key == "Fn::GetAtt":
                found.add(value[0] if isinstance(value, list) else str(value).split(".")[0])
            elif key == "Fn::Sub":
                text = value if isinstance(value, str) else value[0]
                found |= {m.split(".")[0] for m in re.findall(r"\$\{([^!}][^}]*)\}", text)}
                if isinstance(value, list) and len(value) > 1:
                    found |= references(value[1])
            else:
                found |= references(value)
    return found


def dependencies(resources: dict[str, Any]) -> dict[str, set[str]]:
    deps: dict[str, set[str]] = {}
    for name, body in resources.items():
        depends = body.get("DependsOn", [])
        depends = [depends] if isinstance(depends, str) else depends
        deps[name] = (set(depends) | references(body.get("Properties", {}))) & resources.keys()
    return deps


def creation_order(resources: dict[str, Any]) -> list[str]:
    """Logical ids, each after everything it references or DependsOn (CloudFormation's order; cycles are invalid)."""
    deps, order, seen = dependencies(resources), [], set()

    def visit(name: str) -> None:
        if name not in seen:
            seen.add(name)
            for dep in sorted(deps[name]):
                visit(dep)
            order.append(name)

    for name in resources:
        visit(name)
    return order


def _ec2(account_id: str, region_name: str) -> Any:
    return ec2_backends[account_id][region_name]


def _revoke_ingress(rule: Any, account_id: str, region_name: str) -> None:
    _ec2(account_id, region_name).revoke_security_group_ingress(
        rule.security_group.id, None, None, None, [], security_rule_ids=list(getattr(rule, "rule_ids", [])))


def _detach_gateway(attachment: Any, account_id: str, region_name: str) -> None:
    ec2 = _ec2(account_id, region_name)
    if str(attachment.gateway_id).startswith("igw-"):
        ec2.detach_internet_gateway(attachment.gateway_id, attachment.vpc_id)
    else:
        ec2.detach_vpn_gateway(attachment.gateway_id, attachment.vpc_id)


def _disassociate(association: Any, account_id: str, region_name: str) -> None:
    ec2 = _ec2(account_id, region_name)
    ec2.disassociate_route_table(association.association_id)
    ec2.subnet_associations.pop(f"{association.route_table_id}:{association.subnet_id}", None)


#: CloudFormation type -> how to delete a resource that moto creates but cannot delete: its model has neither
#: ``delete()`` nor ``delete_from_cloudformation_json``, so ``ResourceMap._delete_resource`` (parsing.py:939) does
#: nothing, silently -- the route tables stay and ``delete_vpc`` (ec2/models/vpcs.py:837) refuses the VPC.
DELETERS = {
    "AWS::EC2::RouteTable": lambda r, a, g: _ec2(a, g).delete_route_table(r.id),
    "AWS::EC2::Route": lambda r, a, g: _ec2(a, g).delete_route(
        r.route_table.id, r.destination_cidr_block, r.destination_ipv6_cidr_block),
    "AWS::EC2::SubnetRouteTableAssociation": _disassociate,
    "AWS::EC2::NatGateway": lambda r, a, g: _ec2(a, g).delete_nat_gateway(r.id),
    "AWS::EC2::EIP": lambda r, a, g: _ec2(a, g).release_address(
        address=None if r.allocation_id else r.public_ip, allocation_id=r.allocation_id),
    "AWS::EC2::InternetGateway": lambda r, a, g: _ec2(a, g).delete_internet_gateway(r.id),
    "AWS::EC2::VPCGatewayAttachment": _detach_gateway,
    "AWS::EC2::VPCEndpoint": lambda r, a, g: _ec2(a, g).delete_vpc_endpoints([r.id]),
    "AWS::EC2::SecurityGroupIngress": _revoke_ingress,
    "AWS::IAM::ManagedPolicy": lambda r, a, g: iam_backends[a][get_partition(g)].delete_policy(r.arn),
}


def fix_missing_resources() -> None:
    """Resource types of our template that moto's CloudFormation skips or only pretends to create.

    moto: ``AWS::S3::BucketPolicy`` and ``AWS::EC2::SecurityGroupEgress`` have no model (parsing.py:272
    ``resource_class_from_type`` warns "No Moto CloudFormation support" and the resource is never created);
    ``SubnetRouteTableAssociation.create_from_cloudformation_json`` (ec2/models/subnets.py:456) only records the
    pair (``create_subnet_association``, subnets.py:674) -- DescribeRouteTables shows no association -- and its
    Ref is the route table id; ``SecurityGroupIngress`` (security_groups.py:1333) forgets which rule it added (no
    physical id; it cannot be revoked).
    CloudFormation: the bucket gets the policy, the group the egress rule, the route table the subnet association
    (Ref = the association id ``rtbassoc-...``; a rule's Ref is its id ``sgr-...``); deleting the resource removes each
    (https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/aws-resource-s3-bucketpolicy.html,
    .../aws-resource-ec2-securitygroupegress.html, .../aws-resource-ec2-subnetroutetableassociation.html).
    """

    class BucketPolicy(CloudFormationModel):
        def __init__(self, bucket: str, name: str, account_id: str, region_name: str):
            self.bucket, self.name = bucket, name
            self.backend = s3_backends[account_id][get_partition(region_name)]

        @staticmethod
        def cloudformation_name_type() -> str:
            return ""

        @staticmethod
        def cloudformation_type() -> str:
            return "AWS::S3::BucketPolicy"

        @property
        def physical_resource_id(self) -> str:
            return self.name

        @classmethod
        def create_from_cloudformation_json(cls, resource_name: str, cloudformation_json: Any, account_id: str,
                                            region_name: str, **kwargs: Any) -> "BucketPolicy":
            props = cloudformation_json["Properties"]
            policy = cls(props["Bucket"], resource_name, account_id, region_name)
            policy.backend.put_bucket_policy(policy.bucket, json.dumps(props["PolicyDocument"]).encode())
            return policy

        @classmethod
        def update_from_cloudformation_json(cls, original_resource: Any, new_resource_name: str,
                                            cloudformation_json: Any, account_id: str,
                                            region_name: str) -> "BucketPolicy":
            if original_resource.bucket != cloudformation_json["Properties"]["Bucket"]:
                original_resource.delete(account_id, region_name)
            return cls.create_from_cloudformation_json(original_resource.name, cloudformation_json, account_id,
                                                       region_name)

        def delete(self, account_id: str, region_name: str) -> None:
            self.backend.delete_bucket_policy(self.bucket)

    class SecurityGroupEgress(CloudFormationModel):
        def __init__(self, security_group: Any, rule_ids: list[str]):
            self.security_group, self.rule_ids = security_group, rule_ids

        @staticmethod
        def cloudformation_name_type() -> str:
            return ""

        @staticmethod
        def cloudformation_type() -> str:
            return "AWS::EC2::SecurityGroupEgress"

        @property
        def physical_resource_id(self) -> str:
            return self.rule_ids[0] if self.rule_ids else ""

        @classmethod
        def create_from_cloudformation_json(cls, resource_name: str, cloudformation_json: Any, account_id: str,
                                            region_name: str, **kwargs: Any) -> "SecurityGroupEgress":
            props, desc = cloudformation_json["Properties"], cloudformation_json["Properties"].get("Description")
            ranges = [{key: props[key], "Description": desc} for key in ("CidrIp", "CidrIpv6") if key in props]
            groups = [{"GroupId": props["DestinationSecurityGroupId"], "Description": desc}] \
                if "DestinationSecurityGroupId" in props else []
            prefixes = [{"PrefixListId": props["DestinationPrefixListId"]}] if "DestinationPrefixListId" in props else []
            rules, group = _ec2(account_id, region_name).authorize_security_group_egress(
                props["GroupId"], str(props["IpProtocol"]), props.get("FromPort"), props.get("ToPort"), ranges,
                source_groups=groups, prefix_list_ids=prefixes)
            return cls(group, [rule.id for rule in rules])

        def delete(self, account_id: str, region_name: str) -> None:
            _ec2(account_id, region_name).revoke_security_group_egress(
                self.security_group.id, None, None, None, [], security_rule_ids=self.rule_ids)

    def associate(cls: type, resource_name: str, cloudformation_json: Any, account_id: str, region_name: str,
                  **kwargs: Any) -> Any:
        props, ec2 = cloudformation_json["Properties"], _ec2(account_id, region_name)
        association = ec2.create_subnet_association(props["RouteTableId"], props["SubnetId"])
        association.association_id = ec2.associate_route_table(props["RouteTableId"], subnet_id=props["SubnetId"])
        return association

    original_ingress = SecurityGroupIngress.create_from_cloudformation_json.__func__

    def authorize_ingress(cls: type, resource_name: str, cloudformation_json: Any, account_id: str,
                          region_name: str, **kwargs: Any) -> Any:
        props = cloudformation_json["Properties"]
        group = _ec2(account_id, region_name).get_security_group_by_name_or_id(props.get("GroupId") or props.get("GroupName"))
        before = {rule.id for rule in group.ingress_rules} if group else set()
        ingress = original_ingress(cls, resource_name, cloudformation_json, account_id, region_name, **kwargs)
        ingress.rule_ids = [rule.id for rule in ingress.security_group.ingress_rules if rule.id not in before]
        return ingress

    SubnetRouteTableAssociation.create_from_cloudformation_json = classmethod(associate)
    SubnetRouteTableAssociation.physical_resource_id = property(
        lambda self: getattr(self, "association_id", None) or self.route_table_id)
    SecurityGroupIngress.create_from_cloudformation_json = classmethod(authorize_ingress)
    SecurityGroupIngress.physical_resource_id = property(lambda self: (getattr(self, "rule_ids", None) or [""])[0])
    assert {BucketPolicy, SecurityGroupEgress} <= set(CloudFormationModel.__subclasses__())
    for cache in (P.get_model_list, P.get_model_map, P.get_name_type_map):
        cache.cache_clear()


def fix_replacement() -> None:
    """An update of a resource moto cannot update replaces it, as CloudFormation does; its dependents follow.

    moto: ``parse_and_update_resource`` (parsing.py:400) returns None for a model without
    ``update_from_cloudformation_json`` (Subnet, RouteTable, NatGateway, SubnetRouteTableAssociation, ...) and
    ``ResourceMap.update`` (parsing.py:893) stores that None: e.g. after changing ``PrivateSubnet``'s CidrBlock the
    subnet keeps its old CIDR, the stack forgets it (no ``PrivateSubnetId`` output) and DeleteStack then fails on
    the VPC. ``build_resource_diff`` (parsing.py:775) compares raw template JSON, so resources that reference a
    replaced one (the subnet's route table association) are not updated either.
    CloudFormation: a change to a create-only property (Subnet CidrBlock, ...) replaces the resource: creates the
    new one ("Requested update requires the creation of a new physical resource; hence creating one."), updates
    everything that references it, and deletes the old one in UPDATE_COMPLETE_CLEANUP_IN_PROGRESS; a Tags-only
    change is made in place
    (https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/using-cfn-updating-stacks-update-behaviors.html).
    Here: for models moto cannot update (and create-only changes, ``moto_cfn_properties.UPDATES``), the resolved
    properties are compared with those the resource was made with: equal -> kept, only Tags differ (EC2) ->
    retagged, else replaced. Models moto can update keep moto's way. Should the update fail, the replacements are
    deleted and the old resources restored before the rollback.
    """
    original_diff = P.ResourceMap.build_resource_diff
    original_update_map = P.ResourceMap.update

    def build_resource_diff(self: P.ResourceMap, other_template: dict[str, Any],
                            parameters: dict[str, Any] | None = None) -> dict[str, Any]:
        diff = original_diff(self, other_template, parameters)
        new = other_template["Resources"]
        deps, modify = dependencies(new), set(diff["Modify"])
        grew = True
        while grew:  # everything that references a modified resource is re-evaluated (and kept if unchanged)
            more = {name for name in new if name in self._resource_json_map and deps[name] & modify} - modify
            modify |= more
            grew = bool(more)
        diff["Modify"] = [name for name in creation_order(new) if name in modify]
        return diff

    def update_map(self: P.ResourceMap, template: dict[str, Any], parameters: dict[str, Any] | None = None) -> None:
        self._ct_replaced = []
        try:
            original_update_map(self, template, parameters)
        except Exception:  # the update rolls back: the replacements go, the old resources are the stack's again
            for logical_id, old, new, _ in reversed(self._ct_replaced):
                self._parsed_resources[logical_id] = old
                try:
                    self._delete_resource(new, {"Type": new.cf_resource_type})
                except Exception:
                    pass
            raise
        stack = stack_of(self)
        if self._ct_replaced and stack is not None:
            stack.status = "UPDATE_COMPLETE_CLEANUP_IN_PROGRESS"
            stack._add_stack_event("UPDATE_COMPLETE_CLEANUP_IN_PROGRESS")
        for _, old, _, body in reversed(self._ct_replaced):
            try:
                self._delete_resource(old, body)
            except Exception:  # CloudFormation: a failed cleanup does not fail the update (DELETE_FAILED event)
                pass

    P.ResourceMap.build_resource_diff = build_resource_diff
    P.ResourceMap.update = update_map


def update_unupdatable(logical_id: str, parsed: tuple[type, dict[str, Any], str], resources_map: P.ResourceMap,
                       account_id: str, region_name: str) -> Any:
    """The update of a resource whose moto model has no update or whose create-only property changed
    (see :func:`fix_replacement`)."""
    resource_class, resolved, name = parsed
    stack, rtype = stack_of(resources_map), resolved["Type"]
    failed_before(stack, logical_id)
    old = resources_map._parsed_resources.get(logical_id)
    old_props, new_props = getattr(old, "_ct_props", None), resolved.get("Properties", {})
    if old is not None and old_props == new_props:
        return old
    strip = lambda props: {k: v for k, v in (props or {}).items() if k != "Tags"}  # noqa: E731
    if isinstance(old, TaggedEC2Resource) and old_props is not None and strip(old_props) == strip(new_props):
        event(stack, logical_id, rtype, "UPDATE_IN_PROGRESS", physical_id(old))
        tags = lambda props: {t["Key"]: t["Value"] for t in props.get("Tags", [])}  # noqa: E731
        ec2 = _ec2(account_id, region_name)
        ec2.delete_tags([old.id], {k: v for k, v in tags(old_props).items() if k not in tags(new_props)})
        ec2.create_tags([old.id], tags(new_props))
        old._ct_props = new_props
        event(stack, logical_id, rtype, "UPDATE_COMPLETE", physical_id(old))
        return old
    event(stack, logical_id, rtype, "UPDATE_IN_PROGRESS", physical_id(old),
          "Requested update requires the creation of a new physical resource; hence creating one.")
    try:
        new = resource_class.create_from_cloudformation_json(name, resolved, account_id, region_name,
                                                             LogicalId=logical_id, StackId=resources_map.stack_id,
                                                             ResourceType=rtype)
    except Exception as exc:
        event(stack, logical_id, rtype, "UPDATE_FAILED", physical_id(old), reason(exc))
        failed(stack, logical_id, exc)
        raise
    new.cf_resource_type, new.logical_resource_id, new._ct_props = rtype, logical_id, new_props
    if isinstance(new, TaggedEC2Resource):
        _ec2(account_id, region_name).create_tags(
            [new.physical_resource_id], {**resources_map.tags, "aws:cloudformation:logical-id": logical_id})
    if old is not None:  # deleted at cleanup unless UpdateReplacePolicy: Retain
        body = resources_map._resource_json_map[logical_id]
        resources_map._ct_replaced.append(
            (logical_id, old, new, {"Type": rtype, "DeletionPolicy": body.get("UpdateReplacePolicy")}))
    event(stack, logical_id, rtype, "UPDATE_COMPLETE", physical_id(new))
    return new
