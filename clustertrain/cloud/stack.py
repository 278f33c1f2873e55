"""Deploy, inspect and delete the infrastructure stack (``clustertrain cluster infra deploy | status | delete``).

The template is :func:`clustertrain.cloud.infra.build_infra_template`'s. Every deploy goes through a CloudFormation
change set, as ``aws cloudformation deploy`` does: create it (CREATE for a new stack, UPDATE for an existing one), wait
until it is computed, print what it does (:mod:`clustertrain.cloud.changeset`: add / modify / replace / remove, with
replacements called out), refuse it when it replaces a bucket, a file system or the VPC (unless ``allow_replace``) or
shrinks a file system (FSx only grows: never), execute it, follow
the stack's events until the stack settles, and record the outputs in the state file (:mod:`clustertrain.cloud.state`).
A dry run creates the change set, prints it and deletes it again: nothing is deployed.

The stack is ``<cluster name>-infra`` in ``aws.region`` (``aws.infra_stack_name`` overrides the name) and carries the
tag ``clustertrain:project = <project name>``; a stack of that name without the tag is someone else's and is refused.
boto3 finds credentials the usual way (environment, profile, instance role) and honours ``AWS_ENDPOINT_URL``; nothing
here writes a credential anywhere.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator

import yaml

from clustertrain.cloud.changeset import GUARDED, Change, from_aws, merge, predict, refused, shrunk
from clustertrain.cloud.infra import build_infra_template, kept_resources, render_infra_template
from clustertrain.cloud.pcluster import cluster_name
from clustertrain.cloud.project_rules import require_aws
from clustertrain.cloud.state import InfraState, project_state_path, state_path, write_state
from clustertrain.core.errors import CloudError, ConfigError

if TYPE_CHECKING:
    from clustertrain.project import Project

TAG = "clustertrain:project"
#: settled stack states a deploy cannot start from, and what to do
BLOCKED = {
    "ROLLBACK_COMPLETE": "a failed create leaves a stack that cannot be updated: delete it (clustertrain cluster infra delete PROJECT) and deploy again",
    "ROLLBACK_FAILED": "delete it (clustertrain cluster infra delete PROJECT), then deploy again",
    "CREATE_FAILED": "delete it (clustertrain cluster infra delete PROJECT), then deploy again",
    "DELETE_FAILED": "delete it again (clustertrain cluster infra delete PROJECT); the first failed resource is in `clustertrain cluster infra status PROJECT`",
    "UPDATE_ROLLBACK_FAILED": "finish the rollback first: aws cloudformation continue-update-rollback --stack-name {stack} --region {region}",
    "UPDATE_FAILED": "wait for its rollback to finish, then deploy again",
    "IMPORT_ROLLBACK_FAILED": "finish the rollback first: aws cloudformation continue-update-rollback --stack-name {stack} --region {region}",
}
#: a stack in one of these states is settled after a deploy: the deploy worked
SUCCEEDED = {"CREATE_COMPLETE", "UPDATE_COMPLETE"}
Echo = Callable[[str], None]


def stack_name(project: "Project") -> str:
    aws = require_aws(project)
    return aws.infra_stack_name or f"{cluster_name(project)}-infra"


def client(region: str) -> Any:
    import boto3

    return boto3.client("cloudformation", region_name=region)


@contextmanager
def aws_errors(what: str) -> Iterator[None]:
    """A failed AWS call as one CloudError line."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    try:
        yield
    except NoCredentialsError:
        raise CloudError(f"{what}: no AWS credentials found; set AWS_PROFILE or the AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY "
                         "environment variables (clustertrain never stores them)") from None
    except ClientError as e:
        err = e.response.get("Error", {})
        raise CloudError(f"{what}: {err.get('Code', 'error')}: {' '.join(str(err.get('Message', e)).split())}") from None
    except BotoCoreError as e:
        raise CloudError(f"{what}: {' '.join(str(e).split())}") from None


def describe(cf: Any, name: str) -> dict[str, Any] | None:
    """The stack, or None when there is none of that name (deleted stacks are not found by name)."""
    from botocore.exceptions import ClientError

    with aws_errors(f"describe stack {name}"):
        try:
            return cf.describe_stacks(StackName=name)["Stacks"][0]
        except ClientError as e:
            if "does not exist" in str(e.response.get("Error", {}).get("Message", "")):
                return None
            raise


def deployed_template(cf: Any, name: str) -> dict[str, Any]:
    with aws_errors(f"get the template of stack {name}"):
        body = cf.get_template(StackName=name, TemplateStage="Original")["TemplateBody"]
    if isinstance(body, dict):
        return body
    try:
        loaded = yaml.safe_load(body)
    except yaml.YAMLError:  # short-form intrinsics (!Ref): not ours; no prediction
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _check_state(project: "Project", name: str) -> None:
    aws, state = require_aws(project), project.infra_state
    if state is None:
        return
    where = project_state_path(project)
    if state.region != aws.region:
        raise CloudError(f"region mismatch: {where} records stack {state.stack_name} in {state.region}, but aws.region is {aws.region}; "
                         f"set aws.region back to {state.region}, or delete that stack first "
                         f"(clustertrain cluster infra delete PROJECT --set aws.region={state.region}); nothing was deployed")
    if state.stack_name != name:
        raise CloudError(f"{where} records stack {state.stack_name}, but the project now names {name}; delete the old stack first "
                         f"(with the old aws.cluster_name / aws.infra_stack_name) or remove {where}; nothing was deployed")


def _check_stack(project: "Project", stack: dict[str, Any], action: str) -> None:
    name, status, region = stack["StackName"], stack["StackStatus"], require_aws(project).region
    tags = {t["Key"]: t["Value"] for t in stack.get("Tags") or []}
    if tags.get(TAG) != project.name:
        raise CloudError(f"stack {name} in {region} was not created for project {project.name!r} (its tag {TAG} is "
                         f"{tags.get(TAG)!r}); set aws.infra_stack_name to another name; nothing was {action}")
    if status == "REVIEW_IN_PROGRESS":
        raise CloudError(f"stack {name} is REVIEW_IN_PROGRESS: it holds a change set that was never executed and no resources; "
                         f"delete it (clustertrain cluster infra delete PROJECT) and deploy again; nothing was {action}")
    if status.endswith("_IN_PROGRESS"):
        raise CloudError(f"stack {name} is {status}: another operation is running; wait for it "
                         f"(clustertrain cluster infra status PROJECT) and try again; nothing was {action}")
    if status in BLOCKED and action == "deployed":
        reason = f" ({stack['StackStatusReason']})" if stack.get("StackStatusReason") else ""
        raise CloudError(f"stack {name} is {status}{reason}: {BLOCKED[status].format(stack=name, region=region)}; nothing was deployed")


@dataclass
class DeployResult:
    stack_name: str
    region: str
    kind: str                                    # CREATE | UPDATE | NONE (no changes)
    changes: list[Change] = field(default_factory=list)
    executed: bool = False
    status: str = ""
    state: InfraState | None = None


def deploy(project: "Project", *, dry_run: bool = False, allow_replace: bool = False, echo: Echo = print,
           console: Any = None, poll_s: float = 5.0, cf: Any = None) -> DeployResult:
    """Deploy the project's infrastructure stack through a change set (module docstring). Raises one line (CloudError /
    ConfigError) for a project without ``aws:``, a stack in a failed or in-progress state, a region mismatch with the
    state file, a refused replacement, or a failed deploy (its first failed resource and reason)."""
    aws = require_aws(project)
    template = build_infra_template(project)
    body = render_infra_template(template, project.name)
    if len(body.encode()) > 51_200:
        raise ConfigError(f"the infrastructure template is {len(body.encode())} bytes, over CloudFormation's 51,200-byte TemplateBody limit")
    name = stack_name(project)
    _check_state(project, name)
    cf = cf or client(aws.region)
    stack = describe(cf, name)
    if stack is not None:
        _check_stack(project, stack, "deployed")
    kind = "UPDATE" if stack is not None else "CREATE"
    old = deployed_template(cf, name) if stack is not None else {}
    cs_name = "clustertrain-" + _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    tags = [{"Key": TAG, "Value": project.name}] + [{"Key": k, "Value": v} for k, v in aws.tags.items()]
    with aws_errors(f"create change set {cs_name} of stack {name}"):
        created = cf.create_change_set(StackName=name, ChangeSetName=cs_name, ChangeSetType=kind, TemplateBody=body,
                                       Capabilities=["CAPABILITY_IAM"], Tags=tags,
                                       Description=f"clustertrain cluster infra deploy ({project.name})")
    cs_id, stack_id = created["Id"], created["StackId"]

    def discard() -> None:
        with aws_errors(f"delete change set {cs_name}"):
            cf.delete_change_set(ChangeSetName=cs_id)
            if kind == "CREATE":  # the change set left an empty REVIEW_IN_PROGRESS stack
                cf.delete_stack(StackName=stack_id)

    described = _wait_change_set(cf, cs_id, poll_s)
    result = DeployResult(name, aws.region, kind)
    if described["Status"] == "FAILED":
        reason = " ".join(str(described.get("StatusReason", "")).split())
        if "didn't contain changes" in reason or "No updates are to be performed" in reason:
            discard()
            result.kind, result.status = "NONE", stack["StackStatus"] if stack else ""
            echo(f"stack {name} in {aws.region} is up to date: the change set holds no changes")
            if not dry_run and stack is not None:
                result.state = _record(project, cf, name, body, template)
            return result
        discard()
        raise CloudError(f"change set for stack {name} failed: {reason}; nothing was deployed")
    result.changes = merge(from_aws(described["Changes"]), predict(old, template, aws.region))
    echo(f"change set {cs_name} for stack {name} in {aws.region} ({'new stack' if kind == 'CREATE' else 'update'}): "
         f"{len(result.changes)} change(s)")
    for c in result.changes:
        echo("  " + c.describe())
    smaller = shrunk(old, template)
    if smaller:
        discard()
        what = "; ".join(f"{logical} from {was} to {now} GiB" for logical, was, now in smaller)
        raise CloudError(f"deploy refused: the change set shrinks the FSx file system {what}, and FSx for Lustre only grows "
                         "(the update would fail and roll back); set its aws.fsx capacity_gb back to the deployed size or "
                         "more; nothing was deployed")
    bad = refused(result.changes)
    if bad and not allow_replace:
        discard()
        what = "; ".join(f"the {GUARDED[c.resource_type]} {c.logical_id} ({c.why})" for c in bad)
        raise CloudError(f"deploy refused: the change set replaces {what}: a new bucket or file system is an empty one and a "
                         "new VPC rebuilds every subnet and security group; nothing was deployed; pass --allow-replace if "
                         "that is what you want")
    if dry_run:
        discard()
        echo(f"dry run: change set deleted, nothing deployed (deploy: clustertrain cluster infra deploy {project.file or 'PROJECT'})")
        return result
    started = _dt.datetime.now(_dt.timezone.utc) - _dt.timedelta(seconds=5)
    with aws_errors(f"execute change set {cs_name} of stack {name}"):
        cf.execute_change_set(ChangeSetName=cs_id)
    result.executed = True
    final = follow(cf, stack_id, started, len(template["Resources"]), echo, console, poll_s, verb=kind.lower())
    result.status = final["StackStatus"]
    if result.status not in SUCCEEDED:
        raise CloudError(failure_line(cf, stack_id, name, result.status, started))
    result.state = _record(project, cf, name, body, template, final)
    return result


def _wait_change_set(cf: Any, cs_id: str, poll_s: float, timeout_s: float = 900) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        with aws_errors("describe change set"):
            d = cf.describe_change_set(ChangeSetName=cs_id)
            changes = list(d.get("Changes") or [])
            token = d.get("NextToken")
            while token:
                more = cf.describe_change_set(ChangeSetName=cs_id, NextToken=token)
                changes += more.get("Changes") or []
                token = more.get("NextToken")
        d["Changes"] = changes
        if d.get("Status") in ("CREATE_COMPLETE", "FAILED"):
            return d
        if time.monotonic() > deadline:
            raise CloudError(f"change set {cs_id} was not computed within {timeout_s:.0f} s (status {d.get('Status')}); see the CloudFormation console")
        time.sleep(min(poll_s, 2.0))


def events_since(cf: Any, stack_id: str, since: _dt.datetime) -> list[dict[str, Any]]:
    """The stack's events at or after ``since``, oldest first."""
    out: list[dict[str, Any]] = []
    with aws_errors("describe stack events"):
        for page in cf.get_paginator("describe_stack_events").paginate(StackName=stack_id):
            batch = page.get("StackEvents") or []
            out += [e for e in batch if e["Timestamp"] >= since]
            if batch and batch[-1]["Timestamp"] < since:  # newest first: the rest is older
                break
    return sorted(out, key=lambda e: e["Timestamp"])


def follow(cf: Any, stack_id: str, since: _dt.datetime, total: int, echo: Echo, console: Any, poll_s: float,
           verb: str) -> dict[str, Any]:
    """Print the stack's new resource events, with a progress bar of settled resources, until the stack settles."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    seen: set[str] = set()
    done: set[str] = set()
    progress = Progress(TextColumn(f"[bold]{verb}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TextColumn("{task.description}"), console=console, transient=True, disable=console is None)
    with progress:
        task = progress.add_task("", total=total)
        while True:
            with aws_errors("describe stack"):
                stack = cf.describe_stacks(StackName=stack_id)["Stacks"][0]
            for e in events_since(cf, stack_id, since):
                if e["EventId"] in seen:
                    continue
                seen.add(e["EventId"])
                status, logical = e.get("ResourceStatus", ""), e.get("LogicalResourceId", "")
                reason = f" ({' '.join(str(e['ResourceStatusReason']).split())})" if e.get("ResourceStatusReason") else ""
                if e.get("ResourceType") != "AWS::CloudFormation::Stack":
                    echo(f"  {status:<20} {logical} ({e.get('ResourceType', '')}){reason}")
                    if status.endswith("_COMPLETE"):
                        done.add(logical)
                progress.update(task, completed=min(len(done), total), description=f"{stack['StackStatus']}")
            if not stack["StackStatus"].endswith("_IN_PROGRESS"):
                return stack
            time.sleep(poll_s)


def failure_line(cf: Any, stack_id: str, name: str, status: str, since: _dt.datetime) -> str:
    """One line for a stack that did not settle as asked: its first failed resource and the reason."""
    failed = [e for e in events_since(cf, stack_id, since) if e.get("ResourceStatus", "").endswith("_FAILED")]
    first = next((e for e in failed if e.get("ResourceType") != "AWS::CloudFormation::Stack"
                  and "cancelled" not in str(e.get("ResourceStatusReason", "")).lower()), failed[0] if failed else None)
    cause = (f"{first['LogicalResourceId']} ({first.get('ResourceType', '')}) {first['ResourceStatus']}: "
             f"{' '.join(str(first.get('ResourceStatusReason', 'no reason given')).split())}") if first else "no failed resource in its events"
    after = {"ROLLBACK_COMPLETE": "the stack rolled back and holds nothing: fix the cause, delete it (clustertrain cluster infra delete PROJECT) and deploy again",
             "UPDATE_ROLLBACK_COMPLETE": "the update was rolled back; the stack is as before: fix the cause and deploy again"}
    return f"stack {name} is {status}: {cause}; {after.get(status, 'see clustertrain cluster infra status PROJECT')}"


def _record(project: "Project", cf: Any, name: str, body: str, template: dict[str, Any],
            stack: dict[str, Any] | None = None) -> InfraState:
    aws = require_aws(project)
    stack = stack or describe(cf, name) or {}
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs") or []}
    missing = [k for k in template.get("Outputs", {}) if k not in outputs]
    if missing:
        raise CloudError(f"stack {name} is {stack.get('StackStatus')} but lacks the outputs {', '.join(missing)}; "
                         "see clustertrain cluster infra status PROJECT")
    state = InfraState(stack_name=name, stack_id=stack["StackId"], region=aws.region, status=stack["StackStatus"],
                       outputs=outputs, project=project.name,
                       updated=_dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
                       template_sha256=hashlib.sha256(body.encode()).hexdigest(),
                       retained=kept_resources(template))
    if project.file is not None:
        write_state(state_path(project.file), state)
    return state


# ---------------------------------------------------------------------------------------------------- status, delete

def retained_line(logical: str, rtype: str, physical: str) -> str:
    """What a stack delete left behind (DeletionPolicy Retain), and how to delete a bucket once its data is no longer
    needed (the stack's FSx file systems are deleted before it, clustertrain.cloud.filesystems)."""
    cmd = f" (aws s3 rb s3://{physical} --force)" if physical and rtype == "AWS::S3::Bucket" else ""
    return (f"retained {rtype} {physical or logical}: DeletionPolicy Retain keeps the datasets and checkpoints it holds; "
            f"delete it yourself when they are no longer needed{cmd}")


@dataclass
class StackReport:
    stack_name: str
    region: str
    stack: dict[str, Any] | None
    drift: list[Change] = field(default_factory=list)     # what a deploy of the project would change now
    retained: list[tuple[str, str, str]] = field(default_factory=list)  # (logical id, type, physical id) kept by a delete
    resources: int = 0                                                   # resources the stack holds

    @property
    def outputs(self) -> dict[str, str]:
        return {o["OutputKey"]: o["OutputValue"] for o in (self.stack or {}).get("Outputs") or []}


def inspect(project: "Project", cf: Any = None) -> StackReport:
    """The stack, what a deploy would change (the deployed template against the project's), what a delete keeps."""
    aws = require_aws(project)
    name = stack_name(project)
    cf = cf or client(aws.region)
    stack = describe(cf, name)
    report = StackReport(name, aws.region, stack)
    if stack is None:
        return report
    old = deployed_template(cf, name)
    try:
        report.drift = predict(old, build_infra_template(project), aws.region)
    except ConfigError:
        report.drift = []
    physical = {}
    with aws_errors(f"list the resources of stack {name}"):
        for page in cf.get_paginator("list_stack_resources").paginate(StackName=stack["StackId"]):
            physical.update({r["LogicalResourceId"]: r.get("PhysicalResourceId", "") for r in page["StackResourceSummaries"]})
    report.resources = len(physical)
    resources = old.get("Resources") or {}
    report.retained = [(k, resources[k].get("Type", ""), physical.get(k, "")) for k in kept_resources(old)]
    return report


def delete(project: "Project", report: StackReport, *, echo: Echo = print, console: Any = None, poll_s: float = 5.0,
           cf: Any = None) -> str:
    """Delete the stack ``report`` describes (:func:`inspect`), follow it, remove the state file; returns the final status."""
    aws = require_aws(project)
    cf = cf or client(aws.region)
    _check_state(project, report.stack_name)
    stack = report.stack
    if stack is None:
        raise CloudError(f"there is no stack {report.stack_name} in {aws.region}; nothing was deleted")
    if stack["StackStatus"] != "REVIEW_IN_PROGRESS":
        _check_stack(project, stack, "deleted")
    started = _dt.datetime.now(_dt.timezone.utc) - _dt.timedelta(seconds=5)
    with aws_errors(f"delete stack {report.stack_name}"):
        cf.delete_stack(StackName=stack["StackId"])
    final = follow(cf, stack["StackId"], started, max(report.resources, 1), echo, console, poll_s, verb="delete")
    if final["StackStatus"] != "DELETE_COMPLETE":
        raise CloudError(failure_line(cf, stack["StackId"], report.stack_name, final["StackStatus"], started))
    if project.file is not None:
        state_path(project.file).unlink(missing_ok=True)
    return final["StackStatus"]
