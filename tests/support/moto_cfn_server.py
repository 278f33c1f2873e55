"""moto's server with small fixes so that its CloudFormation deploys, reports and deletes our infrastructure template
(``clustertrain cluster infra``) the way AWS CloudFormation does. Run it from the repository root like ``moto_server``::

    python -m tests.support.moto_cfn_server -H 127.0.0.1 -p PORT      # tests: tests.support.moto_cfn.cfn_server()

:func:`apply_fixes` monkeypatches moto (written against :data:`MOTO_VERSION`; file:line below are of that release), then
``moto.server.main()`` serves as usual. Each fix is one ``fix_*`` function whose docstring names the moto code it
corrects and what CloudFormation does; under another moto release the server stops at start, in one line that names
the release needed and the pip command.

1. :func:`fix_execute_change_set` -- Outputs after ExecuteChangeSet (CREATE and UPDATE).
2. :func:`fix_delete` -- DeleteStack deletes every non-``Retain`` resource, in reverse dependency order.
3. :func:`fix_resource_events` -- per-resource stack events.
4. :func:`fix_rollback` -- a resource error is a stack state (ROLLBACK_COMPLETE, UPDATE_ROLLBACK_COMPLETE,
   DELETE_FAILED), not an API error.
5. :func:`fix_stack_states` -- CreateChangeSet refuses what CloudFormation refuses.
6. :mod:`tests.support.moto_cfn_resources` -- resource types moto skips (S3 BucketPolicy, SecurityGroupEgress) or
   fakes (SubnetRouteTableAssociation), deletes it lacks, and replacement of resources moto cannot update.
7. :mod:`tests.support.moto_cfn_properties` -- bucket properties moto ignores; security groups, IAM policies and
   FSx file systems updated in place, or replaced when a create-only property changes.
8. :mod:`tests.support.moto_fsx` -- FSx for Lustre as AWS has it (17-hex ids, VpcId, network interfaces in its
   subnet with its security groups, which EC2 then cannot delete) and ``AWS::FSx::FileSystem``, which moto lacks.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

#: The moto release the fixes here, in moto_cfn_resources, moto_cfn_properties and moto_fsx are written against (their
#: file:line references are of it); pyproject.toml's test extra pins the same (tests/unit/test_moto_pin.py).
MOTO_VERSION = "5.2.5"


def _require_moto() -> None:
    """Stop in one line unless the installed moto is :data:`MOTO_VERSION`: checked before anything imports moto's
    internals, which another release may have moved or changed."""
    try:
        installed: str | None = version("moto")
    except PackageNotFoundError:
        installed = None
    if installed != MOTO_VERSION:
        found = f"moto {installed} is installed" if installed else "moto is not installed"
        raise SystemExit(f"tests.support.moto_cfn_server patches moto {MOTO_VERSION}'s internals, but {found}: "
                         f"pip install 'moto[server]=={MOTO_VERSION}'")


_require_moto()  # before the imports below, which reach into moto's internals

from moto.cloudformation import models as M  # noqa: E402
from moto.cloudformation import parsing as P  # noqa: E402
from moto.cloudformation.exceptions import CloudFormationError, ValidationError  # noqa: E402

from tests.support.moto_cfn_properties import UPDATES, create_only_changed, fix_bucket_properties, fix_security_group_update  # noqa: E402
from tests.support.moto_cfn_resources import (  # noqa: E402
    DELETERS, creation_order, event, failed, failed_before, fix_missing_resources, fix_replacement, physical_id, reason, stack_of,
    update_unupdatable,
)
from tests.support.moto_fsx import fix_fsx  # noqa: E402


class ChangeSetNotFound(CloudFormationError):
    """CloudFormation's ChangeSetNotFoundException (moto: UnboundLocalError or "Stack with id None does not exist")."""

    code = "ChangeSetNotFound"


def _close_outputs(stack: Any) -> None:
    """A deleted or rolled-back stack has no Outputs, and must not re-create resources when asked for them (moto's
    ResourceMap/OutputMap are lazy: reading an output or a resource that is not there creates it)."""
    rmap = stack.resource_map
    rmap._resource_json_map = {k: v for k, v in rmap._resource_json_map.items() if k in rmap._parsed_resources}
    stack.output_map = P.OutputMap(rmap, {}, stack.stack_id)


def fix_resource_events() -> None:
    """Per-resource stack events.

    moto: ``Stack._add_stack_event`` (cloudformation/models.py:480) is only called for the stack itself
    (REVIEW_IN_PROGRESS, CREATE_IN_PROGRESS, CREATE_COMPLETE...); ``parse_and_create_resource`` /
    ``parse_and_update_resource`` (parsing.py:368, 400) create/update resources silently.
    CloudFormation: DescribeStackEvents lists, newest first, one event per resource status change with
    LogicalResourceId, ResourceType, PhysicalResourceId, ResourceStatus (CREATE_IN_PROGRESS, CREATE_COMPLETE,
    CREATE_FAILED, UPDATE_*, DELETE_*, DELETE_SKIPPED) and ResourceStatusReason
    (https://docs.aws.amazon.com/AWSCloudFormation/latest/APIReference/API_StackEvent.html).
    Here: resource maps know their stack; creation and update emit IN_PROGRESS then COMPLETE or FAILED (the
    service error as reason); deletion events come from :func:`fix_delete`. Resources remember the properties they
    were made with (``_ct_props``), so an update can tell what changed: unchanged -> kept as is; a create-only
    property changed (``moto_cfn_properties.UPDATES``) or a model moto cannot update ->
    ``moto_cfn_resources.update_unupdatable`` (retag or replace); else the in-place update of ``UPDATES`` or moto's.
    """
    original_resource_map = M.Stack._create_resource_map

    def _create_resource_map(self: M.Stack) -> P.ResourceMap:
        resource_map = original_resource_map(self)
        resource_map._ct_stack = self
        return resource_map

    def parse_and_create_resource(logical_id: str, resource_json: dict[str, Any], resources_map: P.ResourceMap,
                                  account_id: str, region_name: str) -> Any:
        # parsing.py:368, with events around the one create_from_cloudformation_json call
        condition = resource_json.get("Condition")
        if condition and not resources_map.lazy_condition_map[condition]:
            return None
        rtype = resource_json["Type"]
        parsed = P.parse_resource_and_generate_name(logical_id, resource_json, resources_map)  # creates what it uses
        if not parsed:
            return None
        resource_class, resolved, name = parsed
        stack = stack_of(resources_map)
        event(stack, logical_id, rtype, "CREATE_IN_PROGRESS")
        try:
            resource = resource_class.create_from_cloudformation_json(
                name, resolved, account_id, region_name, LogicalId=logical_id, StackId=resources_map.stack_id,
                ResourceType=rtype)
        except Exception as exc:
            event(stack, logical_id, rtype, "CREATE_FAILED", why=reason(exc))
            failed(stack, logical_id, exc)
            raise
        resource.cf_resource_type, resource.logical_resource_id = rtype, logical_id
        resource._ct_props = resolved.get("Properties", {})
        event(stack, logical_id, rtype, "CREATE_COMPLETE", physical_id(resource))
        return resource

    original_update = P.parse_and_update_resource

    def parse_and_update_resource(logical_id: str, resource_json: dict[str, Any], resources_map: P.ResourceMap,
                                  account_id: str, region_name: str) -> Any:
        parsed = P.parse_resource_and_generate_name(logical_id, resource_json, resources_map)
        if not parsed:
            return None
        stack, rtype, new_props = stack_of(resources_map), resource_json["Type"], parsed[1].get("Properties", {})
        failed_before(stack, logical_id)
        old = resources_map._parsed_resources.get(logical_id)
        old_props = getattr(old, "_ct_props", None)
        if old is not None and old_props == new_props:
            return old  # a dependent re-evaluated by fix_replacement, unchanged
        in_place = UPDATES.get(rtype, ((), None))[1]
        if (old_props is not None and create_only_changed(rtype, old_props, new_props)) or (
                in_place is None and hasattr(parsed[0].update_from_cloudformation_json, "__isabstractmethod__")):
            return update_unupdatable(logical_id, parsed, resources_map, account_id, region_name)
        event(stack, logical_id, rtype, "UPDATE_IN_PROGRESS", physical_id(old))
        try:
            if in_place is None:
                new = original_update(logical_id, resource_json, resources_map, account_id, region_name)
            else:
                in_place(old, new_props, account_id, region_name)
                new = old
        except Exception as exc:
            event(stack, logical_id, rtype, "UPDATE_FAILED", physical_id(old), reason(exc))
            failed(stack, logical_id, exc)
            raise
        new._ct_props = new_props
        event(stack, logical_id, rtype, "UPDATE_COMPLETE", physical_id(new))
        return new

    M.Stack._create_resource_map = _create_resource_map
    P.parse_and_create_resource = parse_and_create_resource
    P.parse_and_update_resource = parse_and_update_resource


def fix_delete() -> None:
    """DeleteStack (and a rollback) deletes every resource without ``DeletionPolicy: Retain``, dependents first.

    moto: ``ResourceMap.delete`` (parsing.py:899) retries in arbitrary set order, and ``_delete_resource``
    (parsing.py:939) silently does nothing for models without a delete (RouteTable, Route, NatGateway, EIP,
    InternetGateway, VPCGatewayAttachment, VPCEndpoint, SecurityGroupIngress, IAM ManagedPolicy... see
    ``moto_cfn_resources.DELETERS``), so ``delete_vpc`` (ec2/models/vpcs.py:837) refuses (more than one route
    table: DependencyViolation) and DeleteStack answers with that error; resources removed from the template by an
    update are deleted even when ``Retain``.
    CloudFormation: deletes in reverse dependency order, keeps ``Retain`` and ``RetainExceptOnCreate`` resources
    (event DELETE_SKIPPED; also when an update removes them; a ``RetainExceptOnCreate`` one is deleted by the rollback
    of the create that made it), ends DELETE_COMPLETE; a resource that cannot be deleted ends the stack DELETE_FAILED,
    and DeleteStack itself succeeds (also for a stack that does not exist)
    (https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/aws-attribute-deletionpolicy.html,
    https://docs.aws.amazon.com/AWSCloudFormation/latest/APIReference/API_DeleteStack.html).
    """
    original_delete_resource = P.ResourceMap._delete_resource

    def kept(self: P.ResourceMap, resource_json: dict[str, Any]) -> bool:
        """``Retain`` always; ``RetainExceptOnCreate`` except in the rollback of the create that made it."""
        policy = resource_json.get("DeletionPolicy")
        return policy == "Retain" or (policy == "RetainExceptOnCreate" and not getattr(self, "_ct_create_rollback", False))

    def _delete_resource(self: P.ResourceMap, resource: Any, resource_json: dict[str, Any]) -> None:
        stack, rtype, physical = stack_of(self), resource_json["Type"], physical_id(resource)
        logical_id = getattr(resource, "logical_resource_id", "")
        failed_before(stack, logical_id)
        if kept(self, resource_json):
            event(stack, logical_id, rtype, "DELETE_SKIPPED", physical)
            return
        event(stack, logical_id, rtype, "DELETE_IN_PROGRESS", physical)
        try:
            deleter = DELETERS.get(rtype)
            if deleter is None:
                original_delete_resource(self, resource, resource_json)
            else:
                deleter(resource, self._account_id, self._region_name)
        except Exception as exc:
            event(stack, logical_id, rtype, "DELETE_FAILED", physical, reason(exc))
            failed(stack, logical_id, exc)
            raise
        event(stack, logical_id, rtype, "DELETE_COMPLETE", physical)

    def delete(self: P.ResourceMap) -> None:
        for logical_id in reversed(creation_order(self._resource_json_map)):
            resource = self._parsed_resources.get(logical_id)
            if resource is None or isinstance(resource, str):  # never created (unsupported type, false condition)
                continue
            body = self._resource_json_map[logical_id]
            self._delete_resource(resource, body)
            if not kept(self, body):
                self._parsed_resources.pop(logical_id)

    def stack_delete(self: M.Stack) -> None:  # models.py:606, with the stack status on the way and no outputs after
        self.status, self._ct_failed = "DELETE_IN_PROGRESS", {}
        self._add_stack_event("DELETE_IN_PROGRESS", resource_status_reason="User Initiated")
        self.resource_map.delete()
        _close_outputs(self)
        self._add_stack_event("DELETE_COMPLETE")
        self.status = "DELETE_COMPLETE"

    def delete_stack(self: M.CloudFormationBackend, name_or_stack_id: str) -> None:  # models.py:1291
        stack = self.stacks.get(name_or_stack_id) or next(
            (s for s in self.stacks.values() if s.name == name_or_stack_id), None)
        if stack is None:
            return
        try:
            stack.delete()
        except Exception:
            stack.status = "DELETE_FAILED"
            stack._add_stack_event(
                "DELETE_FAILED", f"The following resource(s) failed to delete: [{', '.join(stack._ct_failed)}]. ")
            return
        self.stacks.pop(stack.stack_id)
        self.deleted_stacks[stack.stack_id] = stack
        for export in stack.exports:
            self.exports.pop(export.name, None)

    P.ResourceMap._delete_resource = _delete_resource
    P.ResourceMap.delete = delete
    M.Stack.delete = stack_delete
    M.CloudFormationBackend.delete_stack = delete_stack


def fix_rollback() -> None:
    """A resource that fails to create or update rolls the stack back; the API call that started it succeeds.

    moto: ``Stack.create_resources`` / ``Stack.update`` (models.py:566, 582) let the resource's exception out, so
    CreateStack / UpdateStack / ExecuteChangeSet answer with it (e.g. BucketAlreadyExists) and the stack stays
    CREATE_IN_PROGRESS or REVIEW_IN_PROGRESS ("TODO: handle execution errors and implement rollback", models.py:1159).
    CloudFormation: the resource gets CREATE_FAILED (reason: the service's error), the stack ROLLBACK_IN_PROGRESS
    ("The following resource(s) failed to create: [X]. Rollback requested by user."), what was created is deleted
    (``Retain`` resources are kept: DELETE_SKIPPED; ``RetainExceptOnCreate`` ones are deleted), and the stack ends ROLLBACK_COMPLETE (ROLLBACK_FAILED if a
    delete fails), without Outputs; it can then only be deleted. A failed update goes back to the previous template:
    UPDATE_ROLLBACK_COMPLETE
    (https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/stack-failure-options.html).
    """
    original_create = M.Stack.create_resources
    original_update = M.Stack.update

    def create_resources(self: M.Stack) -> None:
        self._ct_failed = {}
        try:
            original_create(self)
        except Exception:
            self.status = "ROLLBACK_IN_PROGRESS"
            self._add_stack_event("ROLLBACK_IN_PROGRESS", "The following resource(s) failed to create: "
                                  f"[{', '.join(self._ct_failed)}]. Rollback requested by user.")
            self._ct_failed = {}
            self.resource_map._ct_create_rollback = True  # RetainExceptOnCreate resources go too
            try:
                self.resource_map.delete()
            except Exception as exc:  # e.g. a kept (Retain) file system's interfaces hold its subnet: DependencyViolation
                _close_outputs(self)
                self.status = "ROLLBACK_FAILED"
                self._add_stack_event("ROLLBACK_FAILED", reason(exc))
                return
            _close_outputs(self)
            self.status = "ROLLBACK_COMPLETE"
            self._add_stack_event("ROLLBACK_COMPLETE")

    def update(self: M.Stack, template: str, role_arn: str | None = None,
               parameters: dict[str, Any] | None = None, tags: dict[str, str] | None = None) -> None:
        previous_template, previous_parameters = self.template, dict(self.resource_map.input_parameters)
        self.status, self._ct_failed = "UPDATE_IN_PROGRESS", {}
        try:
            original_update(self, template, role_arn, parameters, tags)
        except Exception:
            self.status = "UPDATE_ROLLBACK_IN_PROGRESS"
            self._add_stack_event("UPDATE_ROLLBACK_IN_PROGRESS",
                                  f"The following resource(s) failed to update: [{', '.join(self._ct_failed)}]. ")
            self.template, self._ct_failed = previous_template, {}
            self._parse_template()
            try:
                self.resource_map.update(self.template_dict, previous_parameters)
            except Exception as exc:
                self.status = "UPDATE_ROLLBACK_FAILED"
                self._add_stack_event("UPDATE_ROLLBACK_FAILED", reason(exc))
                return
            self.output_map = self._create_output_map()
            self.status = "UPDATE_ROLLBACK_COMPLETE"
            self._add_stack_event("UPDATE_ROLLBACK_COMPLETE")

    M.Stack.create_resources = create_resources
    M.Stack.update = update


def _find_change_set(backend: M.CloudFormationBackend, name: str, stack_name: str | None) -> M.ChangeSet:
    if name in backend.change_sets:
        return backend.change_sets[name]
    for change_set in reversed(list(backend.change_sets.values())):
        if change_set.change_set_name == name and stack_name in (None, change_set.stack_name, change_set.stack_id):
            return change_set
    raise ChangeSetNotFound(f"ChangeSet [{name}] does not exist")


def fix_execute_change_set() -> None:
    """ExecuteChangeSet creates/updates the stack the way CreateStack/UpdateStack do, Outputs included.

    moto: ``create_change_set`` (models.py:1051) builds a CREATE change set's stack with ``template={}``;
    ``execute_change_set`` (models.py:1144) runs ``ChangeSet.apply()`` (models.py:747: ``resource_map.update`` only)
    and then sets ``stack.template``, never ``template_dict``/``output_map``: DescribeStacks has no Outputs after a
    CREATE change set and stale ones after an UPDATE; resources get no ``aws:cloudformation:*`` tags. It also finds
    a change set by name alone (the last one of any stack) and executes one twice.
    CloudFormation: executing a change set is a stack create/update; once complete the stack has the template's
    Outputs; the stack's other change sets become OBSOLETE
    (https://docs.aws.amazon.com/AWSCloudFormation/latest/APIReference/API_ExecuteChangeSet.html).
    (The same bug was fixed in another emulator: faiscadev/fakecloud PR #1715.)
    Here: CREATE -> the stack gets the change set's template and runs ``Stack.create_resources()`` (CreateStack's
    path); UPDATE -> ``Stack.update()`` (UpdateStack's path). Failures roll back (:func:`fix_rollback`).
    """

    def execute_change_set(self: M.CloudFormationBackend, change_set_name: str, stack_name: str | None = None) -> None:
        change_set = _find_change_set(self, change_set_name, stack_name)
        if change_set.execution_status != "AVAILABLE":
            raise ValidationError(message=f"ChangeSet [{change_set.change_set_id}] cannot be executed in its current "
                                          f"execution status of [{change_set.execution_status}]")
        stack = self.stacks[change_set.stack_id]
        if change_set.change_set_type == "CREATE":
            stack.template, stack.parameters = change_set.template, change_set.parameters
            stack.tags = change_set.tags or stack.tags
            stack._parse_template()
            stack.description = stack.template_dict.get("Description")
            stack.cross_stack_resources = self.exports
            stack.resource_map = stack._create_resource_map()
            stack.output_map = stack._create_output_map()
            self._validate_export_uniqueness(stack)
            stack.status = "CREATE_IN_PROGRESS"
            stack._add_stack_event("CREATE_IN_PROGRESS", resource_status_reason="User Initiated")
            stack.create_resources()
            if stack.status == "CREATE_COMPLETE":
                for export in stack.exports:
                    self.exports[export.name] = export
        else:
            stack.update(change_set.template, change_set.role_arn, parameters=change_set.parameters,
                         tags=change_set.tags or None)
        done = stack.status in ("CREATE_COMPLETE", "UPDATE_COMPLETE")
        change_set.execution_status = "EXECUTE_COMPLETE" if done else "EXECUTE_FAILED"
        for other in self.change_sets.values():
            if other is not change_set and other.stack_id == stack.stack_id and other.execution_status == "AVAILABLE":
                other.execution_status = "OBSOLETE"

    M.CloudFormationBackend.execute_change_set = execute_change_set


def fix_stack_states() -> None:
    """CreateChangeSet refuses a CREATE for a stack that exists and an UPDATE for a stack that cannot be updated.

    moto: ``create_change_set`` (models.py:1051) makes a second stack of the same name for every CREATE (also while
    the first is REVIEW_IN_PROGRESS), and accepts an UPDATE in any state.
    CloudFormation: ValidationError "Stack [NAME] already exists and cannot be created again with the changeSet
    [CS]." unless the stack is REVIEW_IN_PROGRESS (then the change set joins that stack), and "Stack:ARN is in
    ROLLBACK_COMPLETE state and can not be updated." for ROLLBACK_COMPLETE/ROLLBACK_FAILED/DELETE_FAILED/
    REVIEW_IN_PROGRESS and *_IN_PROGRESS stacks: a stack that failed to create must be deleted first
    (https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/troubleshooting.html).
    """
    original = M.CloudFormationBackend.create_change_set

    def create_change_set(self: M.CloudFormationBackend, stack_name: str, change_set_name: str, template: str,
                          parameters: dict[str, str], description: str, change_set_type: str,
                          **kwargs: Any) -> tuple[str, str]:
        live = [s for s in self.stacks.values() if s.name == stack_name]
        if change_set_type == "CREATE" and any(s.status != "REVIEW_IN_PROGRESS" for s in live):
            raise ValidationError(message=f"Stack [{stack_name}] already exists and cannot be created again with "
                                          f"the changeSet [{change_set_name}].")
        if change_set_type == "UPDATE" and live and (live[0].status.endswith("_IN_PROGRESS") or live[0].status in (
                "ROLLBACK_COMPLETE", "ROLLBACK_FAILED", "DELETE_FAILED")):
            raise ValidationError(message=f"Stack:{live[0].stack_id} is in {live[0].status} state and can not be updated.")
        if change_set_type == "CREATE" and live:  # REVIEW_IN_PROGRESS: one more change set for the same stack
            change_set = M.ChangeSet(change_set_type="CREATE", change_set_id=M.generate_changeset_id(
                change_set_name, self.region_name, self.account_id), change_set_name=change_set_name, stack=live[0],
                template=template, parameters=parameters, description=description, **kwargs)
            change_set.status, change_set.execution_status = "CREATE_COMPLETE", "AVAILABLE"
            self.change_sets[change_set.change_set_id] = change_set
            return change_set.change_set_id, live[0].stack_id
        return original(self, stack_name, change_set_name, template, parameters, description, change_set_type, **kwargs)

    M.CloudFormationBackend.create_change_set = create_change_set


def apply_fixes() -> None:
    """Apply every fix to moto, in this process."""
    fix_resource_events()
    fix_delete()
    fix_rollback()
    fix_execute_change_set()
    fix_stack_states()
    fix_missing_resources()
    fix_bucket_properties()
    fix_security_group_update()
    fix_replacement()
    fix_fsx()


if __name__ == "__main__":
    from moto.server import main

    apply_fixes()
    main()
