"""Deploying the flagship's infrastructure template on the moto CloudFormation server (tests/support/moto_cfn.py) the way
``clustertrain cluster infra deploy`` does, for tests/integration/cloud/test_moto_cfn.py and test_moto_fsx.py: change
sets, polling, events, and the module-scoped ``aws`` (boto3 clients on the module's server) and ``flagship`` (the
example deployed once, only read) fixtures, which those modules import."""

from __future__ import annotations

import time
from pathlib import Path

import boto3
import botocore.exceptions
import pytest

from clustertrain.cloud.infra import build_infra_template, render_infra_template
from clustertrain.project import Project
from clustertrain.resolve import load_project

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "p5e-80x7.yaml"


def project_for(suffix: str = "", *overrides: str, fsx: bool = True) -> Project:
    """The example project; with ``suffix``, its two buckets are renamed ``NAME-SUFFIX``; with ``fsx=False`` its file
    systems all name a ``file_system_id`` (ids in the AWS documentation's form), so the template creates none."""
    plain = load_project(EXAMPLE)
    if suffix:
        buckets = plain.aws.buckets
        overrides = (f"aws.buckets.data={buckets.data}-{suffix}", f"aws.buckets.checkpoints={buckets.checkpoints}-{suffix}",
                     *overrides)
    if not fsx:
        overrides = (*overrides, *(f"aws.fsx.{f.name}.file_system_id=fs-0123456789abcdef{i}" for i, f in enumerate(plain.aws.fsx)))
    return load_project(EXAMPLE, list(overrides)) if overrides else plain


def created_fsx(project: Project) -> list:
    """The project's file systems that its infrastructure stack creates."""
    return [f for f in project.aws.fsx if f.file_system_id is None]


def body_of(project: Project) -> str:
    return render_infra_template(build_infra_template(project), project.name)


def wait(cf, stack: str) -> dict:
    """Poll DescribeStacks until the stack is no longer *_IN_PROGRESS (moto finishes within the call; AWS does not)."""
    deadline = time.monotonic() + 30
    while True:
        found = cf.describe_stacks(StackName=stack)["Stacks"][0]
        if not found["StackStatus"].endswith("_IN_PROGRESS") or time.monotonic() > deadline:
            return found


def change(cf, stack: str, project: Project, kind: str = "CREATE", name: str = "deploy-1") -> tuple[dict, dict]:
    """One change set, described then executed: (the change set before execution, the stack after)."""
    made = cf.create_change_set(StackName=stack, ChangeSetName=name, ChangeSetType=kind, TemplateBody=body_of(project),
                                Capabilities=["CAPABILITY_IAM"])
    described = cf.describe_change_set(ChangeSetName=name, StackName=stack)
    cf.execute_change_set(ChangeSetName=name, StackName=stack)
    return described, wait(cf, made["StackId"])


def outputs(stack: dict) -> dict[str, str]:
    return {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}


def events(cf, stack: str) -> list[dict]:
    """The stack's events, oldest first (the API lists newest first)."""
    return cf.describe_stack_events(StackName=stack)["StackEvents"][::-1]


def error_code(call) -> str:
    with pytest.raises(botocore.exceptions.ClientError) as caught:
        call()
    return caught.value.response["Error"]["Code"]


@pytest.fixture(scope="module")
def aws(cfn_endpoint):
    region = load_project(EXAMPLE).aws.region
    return {name: boto3.client(name, endpoint_url=cfn_endpoint, region_name=region)
            for name in ("cloudformation", "ec2", "s3", "iam", "fsx")}


@pytest.fixture(scope="module")
def flagship(aws):
    """(project, change set as described before execution, stack after execution) of the example as shipped."""
    project = project_for()
    described, stack = change(aws["cloudformation"], "p5e-80x7-infra", project)
    return project, described, stack
