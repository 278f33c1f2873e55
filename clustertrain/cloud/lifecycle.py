"""``clustertrain cluster create | status | update | delete``: drive aws-parallelcluster's own ``pcluster`` CLI.

What changes the world is built as a value first, a :class:`Plan` (a list of :class:`Step`), then executed;
``--dry-run`` prints the plan, one shell command per line (``shlex.join``), and runs and writes nothing.

* create: check the project (``clustertrain check``'s cluster sections), write the config and the node scripts,
  upload the scripts, ``pcluster create-cluster --dryrun true`` (pcluster's own validators: subnets, key pair,
  AMI, IAM policies, script URLs; its errors stop here, before anything is created), ``create-cluster``, then
  follow ``describe-cluster`` until CREATE_COMPLETE or CREATE_FAILED. The scripts go up before the dry run so that
  pcluster's URL validator checks the very objects the config points to.
* update: the same config and scripts; ``update-cluster --dryrun true`` prints the change set and stops on
  ``updateValidationErrors`` (one that needs the compute fleet stopped names the command that stops it); then the
  scripts go up (only now: new compute nodes of the running cluster download them at boot), ``update-cluster``,
  and follow until UPDATE_COMPLETE or UPDATE_FAILED.
* delete: describe, confirm, ``delete-cluster``, follow until describe-cluster says the cluster does not exist.
* status: ``describe-cluster`` as a few lines.

Files, beside the project file, each written atomically and never by ``--dry-run``:

    NAME.cluster.yaml    the ParallelCluster config given to pcluster (the text ``clustertrain cluster config`` writes)
    NAME.node-scripts/   the node scripts uploaded to ``aws.scripts_s3_uri`` (default s3://DATA_BUCKET/clustertrain/node-scripts;
                         what ``clustertrain cluster scripts`` writes)

A real create or update refuses a project with ``aws.example_ids: true`` (documentation ids: no cluster can use them)
before it writes anything; ``--dry-run`` still prints its commands.

Credentials: pcluster and boto3 take them from the environment or profile, which passes through unchanged; nothing
here reads, writes or passes one. The key pair is named (``HeadNode.Ssh.KeyName``), never read.

pcluster's output (aws-parallelcluster 3.16.1, ``pcluster/cli/entrypoint.py`` ``main``): JSON on stdout. Success:
the operation's response (``pcluster/api/openapi/openapi.yaml``, e.g. DescribeClusterResponseContent). Failure: exit
1 and ``{"message": ...}`` plus, for a rejected config, ``configurationValidationErrors`` ([{level, type, message}])
or ``updateValidationErrors`` ([{parameter, currentValue, requestedValue, message}]) and ``changeSet``. A dry run
that would succeed ALSO exits 1: DryrunOperationException (``pcluster/api/errors.py`` line 135), message
:data:`DRYRUN_OK`, with ``validationMessages`` and, for update-cluster, ``changeSet``.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clustertrain.cloud.pcluster import build_cluster_config, cluster_name, render_cluster_config, require_aws, scripts_uri
from clustertrain.cloud.scripts import render_node_scripts, upload_command, write_node_scripts
from clustertrain.core.errors import CloudError, ConfigError
from clustertrain.core.run_paths import write_atomic

if TYPE_CHECKING:
    from clustertrain.project import Project

DRYRUN_OK = "Request would have succeeded, but DryRun flag is set."
NO_CHANGES = "No changes found in your cluster configuration."
NOT_FOUND = "does not exist"  # describe/delete-cluster: "Cluster 'N' does not exist or belongs to an incompatible ..."
DEFAULT_POLL_S = 30.0
TRANSIENT_POLLS = 3  # consecutive failed describe-cluster calls tolerated while following
FOLLOW = {"create": ("CREATE_COMPLETE", "CREATE_FAILED"), "update": ("UPDATE_COMPLETE", "UPDATE_FAILED"),
          "delete": (None, "DELETE_FAILED")}
Say = Callable[[str], None]


@dataclass(frozen=True)
class Step:
    """``argv`` runs (kinds pcluster, dryrun, describe, follow) or is the shell equivalent of what clustertrain does
    itself (config, scripts, upload); ``note`` prints as a shell comment."""

    kind: str
    argv: tuple[str, ...]
    note: str = ""

    def line(self) -> str:
        return shlex.join(self.argv) + (f"  # {self.note}" if self.note else "")


@dataclass
class Plan:
    """Everything one lifecycle command will do, in order."""

    action: str
    project: "Project"
    name: str
    region: str
    steps: list[Step]
    config_path: Path | None = None
    scripts_dir: Path | None = None
    config: dict[str, Any] = field(default_factory=dict)
    scripts: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [s.line() for s in self.steps]


@dataclass
class Reply:
    """One pcluster run: exit status and its JSON answer (stdout as ``message`` when it was not JSON)."""

    argv: tuple[str, ...]
    rc: int
    data: dict[str, Any]
    stderr: str = ""

    @property
    def message(self) -> str:
        return " ".join(str(self.data.get("message", "")).split())

    @property
    def dryrun_ok(self) -> bool:
        return self.message == DRYRUN_OK

    @property
    def not_found(self) -> bool:
        return self.rc != 0 and NOT_FOUND in self.message

    def error_line(self) -> str:
        """pcluster's refusal as one line: the first config/update validation error and how many more, or its message."""
        op = self.argv[1] if len(self.argv) > 1 else "?"
        config_errors = self.data.get("configurationValidationErrors") or []
        errors = [e for e in config_errors if e.get("level") == "ERROR"] or config_errors
        if errors:
            first = errors[0]
            text = f"{first.get('type', 'validator')}: {first.get('message', '')}"
        elif self.data.get("updateValidationErrors"):
            errors = self.data["updateValidationErrors"]
            first = errors[0]
            text = (f"{first.get('parameter')}: {first.get('message')} "
                    f"(current {first.get('currentValue')}, requested {first.get('requestedValue')})")
        elif self.message:
            return f"pcluster {op}: {self.message}"
        else:
            tail = " ".join(self.stderr.split()[-40:]) or "no output"
            return f"pcluster {op} failed (exit {self.rc}) without a JSON answer: {tail}; see ~/.parallelcluster/pcluster-cli.log"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return " ".join(f"pcluster {op} rejected the config: {text}{more}".split())

    def notes(self) -> list[str]:
        """pcluster's validation messages below the failure level, one line each."""
        return [" ".join(f"pcluster {m.get('level', 'INFO').lower()}: {m.get('message', '')} [{m.get('type', '')}]".split())
                for m in self.data.get("validationMessages") or []]


Runner = Callable[[Sequence[str]], Reply]


def find_pcluster() -> str:
    """The pcluster executable beside this Python (the ``aws`` extra's venv) or on PATH."""
    beside = Path(sys.executable).with_name("pcluster")
    found = str(beside) if beside.exists() else shutil.which("pcluster")
    if not found:
        raise CloudError("pcluster not found: install the aws extra: pip install 'clustertrain[aws]'")
    return found


class Pcluster:
    """Runs ``pcluster`` (argv[0] of a step is replaced by the executable); the environment passes through."""

    def __init__(self, exe: str | None = None) -> None:
        self.exe = exe or find_pcluster()

    def __call__(self, argv: Sequence[str]) -> Reply:
        proc = subprocess.run([self.exe, *argv[1:]], capture_output=True, text=True, stdin=subprocess.DEVNULL)
        try:
            data = json.loads(proc.stdout) if proc.stdout.strip() else {}
        except json.JSONDecodeError:
            data = {"message": proc.stdout}
        return Reply(tuple(argv), proc.returncode, data if isinstance(data, dict) else {"value": data}, proc.stderr)


# -- plans ------------------------------------------------------------------------------------------------------
def cluster_files(project: "Project") -> tuple[Path, Path]:
    """``dir/NAME.yaml`` -> (``dir/NAME.cluster.yaml``, ``dir/NAME.node-scripts``)."""
    if project.file is None:
        raise ConfigError(f"project {project.name!r} was not read from a file; the cluster commands need one (PROJECT)")
    return project.file.with_name(project.file.stem + ".cluster.yaml"), project.file.with_name(project.file.stem + ".node-scripts")


def pcluster_argv(op: str, name: str, region: str, config: Path | None = None, dryrun: bool = False,
                  suppress: Sequence[str] = ()) -> tuple[str, ...]:
    argv = ["pcluster", op, "--cluster-name", name]
    if config is not None:
        argv += ["--cluster-configuration", str(config)]
    argv += ["--region", region]
    if dryrun:
        argv += ["--dryrun", "true"]
    if suppress:
        argv += ["--suppress-validators", *(s if s == "ALL" or s.startswith("type:") else f"type:{s}" for s in suppress)]
    return tuple(argv)


def _checked(project: "Project", action: str) -> tuple[dict[str, Any], list[str]]:
    """The config as ``clustertrain cluster config`` would write it, after the same checks; [warnings]."""
    from clustertrain.check import require_clean
    from clustertrain.cloud.preflight import cloud_report

    require_clean(project, f"cluster {action}")
    report = cloud_report(project)
    if report.errors:
        first = report.errors[0]
        raise ConfigError(f"{first.path}: {first.message}; fix: {first.fix}; nothing was run")
    return build_cluster_config(project), [str(f) for f in report.warnings]


def plan(action: str, project: "Project", suppress: Sequence[str] = (), poll_s: float = DEFAULT_POLL_S) -> Plan:
    """The plan of ``action`` (create, update, delete, status) for ``project``; raises ConfigError for a bad project."""
    aws = require_aws(project)
    name, region = cluster_name(project), aws.region
    p = Plan(action, project, name, region, [])
    describe = pcluster_argv("describe-cluster", name, region)
    if action in ("create", "update"):
        p.config, p.warnings = _checked(project, action)
        p.scripts = render_node_scripts(project)
        p.config_path, p.scripts_dir = cluster_files(project)
        sets = [a for item in project.overrides for a in ("--set", item)]
        cfg = p.config_path
        write = [Step("config", ("clustertrain", "cluster", "config", str(project.file), "-o", str(cfg), *sets)),
                 Step("scripts", ("clustertrain", "cluster", "scripts", str(project.file), "-o", str(p.scripts_dir), *sets))]
        upload = Step("upload", tuple(shlex.split(upload_command(project, p.scripts_dir))))
        op = f"{action}-cluster"
        dry = Step("dryrun", pcluster_argv(op, name, region, cfg, True, suppress),
                   "pcluster's validators; stops on errors" if action == "create" else "prints the change set; stops on update errors")
        run = Step("pcluster", pcluster_argv(op, name, region, cfg, False, suppress))
        p.steps = write + ([upload, dry] if action == "create" else [dry, upload]) + [run]
    elif action == "delete":
        p.steps = [Step("describe", describe, "what will be deleted; then asks to confirm (--yes skips)"),
                   Step("pcluster", pcluster_argv("delete-cluster", name, region))]
    elif action == "status":
        return Plan(action, project, name, region, [Step("describe", describe)])
    else:
        raise ValueError(action)
    done, failed = FOLLOW[action]
    until = f"until {done} (stops at {failed})" if done else f"until the cluster is gone (stops at {failed})"
    p.steps.append(Step("follow", describe, f"every {poll_s:g} s {until}"))
    return p


# -- execution --------------------------------------------------------------------------------------------------
def execute(p: Plan, run: Runner | None = None, say: Say = print, confirm: Callable[[str], bool] | None = None,
            poll_s: float = DEFAULT_POLL_S, sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Run the plan's steps in order; returns the last describe-cluster answer ({} once a cluster is deleted)."""
    if p.action in ("create", "update") and require_aws(p.project).example_ids:
        raise ConfigError("aws.example_ids is true: the project's ids are documentation examples, no cluster can use them; "
                          f"deploy the infrastructure (clustertrain cluster infra deploy {p.project.file}), fill in the real "
                          "ids and remove aws.example_ids")
    run = run or Pcluster()
    for w in p.warnings:
        say(w)
    described: dict[str, Any] = {}
    for step in p.steps:
        if step.kind == "config" and p.config_path:
            write_atomic(p.config_path, render_cluster_config(p.config, p.project.name, p.name))
            say(f"wrote {p.config_path}")
        elif step.kind == "scripts" and p.scripts_dir:
            write_node_scripts(p.scripts, p.scripts_dir)
        elif step.kind == "upload":
            say(f"uploaded {upload_scripts(p)} node scripts to {scripts_uri(p.project)}")
        elif step.kind == "dryrun":
            if not check_dry_run(p, run(step.argv), say):
                return {}
        elif step.kind == "describe":
            reply = run(step.argv)
            if reply.not_found:
                if p.action == "status":
                    raise CloudError(f"cluster {p.name} does not exist in {p.region}; create it: clustertrain cluster create {p.project.file}")
                say(f"cluster {p.name} does not exist in {p.region}: nothing to delete")
                return {}
            if reply.rc != 0:
                raise CloudError(reply.error_line())
            described = reply.data
            for line in status_lines(described):
                say(line)
            if p.action == "delete" and confirm is not None and not confirm(f"delete cluster {p.name} in {p.region}?"):
                raise CloudError(f"cluster {p.name} not deleted (not confirmed; --yes skips the question)")
        elif step.kind == "pcluster":
            reply = run(step.argv)
            if reply.rc != 0:
                raise CloudError(reply.error_line())
            stack = (reply.data.get("cluster") or {}).get("cloudformationStackArn")
            say(f"{p.action} of cluster {p.name} started" + (f": {stack}" if stack else ""))
        elif step.kind == "follow":
            described = follow(p, run, say, poll_s, sleep)
    return described


def check_dry_run(p: Plan, reply: Reply, say: Say) -> bool:
    """Act on ``--dryrun true``'s answer: raise on errors, print notes and the change set; False: nothing to do."""
    if p.action == "update" and reply.message == NO_CHANGES:
        say(f"no changes: cluster {p.name} already runs this config; nothing was updated")
        return False
    if not reply.dryrun_ok:
        fleet = [e for e in reply.data.get("updateValidationErrors") or [] if "Stop the compute fleet" in str(e.get("message"))]
        if fleet:
            stop = pcluster_argv("update-compute-fleet", p.name, p.region) + ("--status", "STOP_REQUESTED")
            raise CloudError(f"{reply.error_line().rstrip('.')}; this change needs the compute fleet stopped (its running jobs end): "
                             f"{shlex.join(stop)}, wait for STOPPED (clustertrain cluster status), then update again")
        raise CloudError(f"{reply.error_line().rstrip('.')}; nothing was {p.action}d")
    for line in reply.notes():
        say(line)
    if p.action == "update":
        strategy = p.config["Scheduling"]["SlurmSettings"].get("QueueUpdateStrategy")
        say(f"queue update strategy: {strategy + ' (a queue targets reserved capacity)' if strategy else 'COMPUTE_FLEET_STOP (ParallelCluster default)'}")
        for c in reply.data.get("changeSet") or []:
            say(f"change: {c.get('parameter')}: {c.get('currentValue')} -> {c.get('requestedValue')}")
    return True


def upload_scripts(p: Plan) -> int:
    """Put the written node scripts under ``scripts_uri`` with clustertrain's S3 store (sha256 recorded); how many."""
    from clustertrain.storage.manifest import hash_file
    from clustertrain.storage.store import StoreConfig
    from clustertrain.storage.stores import open_store

    assert p.scripts_dir is not None
    store = open_store(scripts_uri(p.project), StoreConfig(region=p.region))
    for name in sorted(p.scripts):
        path = p.scripts_dir / name
        store.put(path, name, hash_file(path))
    return len(p.scripts)


@contextlib.contextmanager
def _status_line() -> Iterator[Callable[[str], None]]:
    """A live status line on a terminal's stderr; a no-op elsewhere (the changes are printed as lines anyway)."""
    from rich.console import Console

    console = Console(stderr=True)
    if not console.is_terminal:
        yield lambda _text: None
        return
    with console.status("") as status:
        yield lambda text: status.update(text)


def follow(p: Plan, run: Runner, say: Say, poll_s: float = DEFAULT_POLL_S,
           sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Poll describe-cluster until the plan's action is done; raise one line at its failure state. Ctrl-C stops the
    following only (CloudFormation goes on): it says how to look again."""
    try:
        return _follow(p, run, say, poll_s, sleep)
    except KeyboardInterrupt:
        say(f"stopped following; the {p.action} goes on in CloudFormation: clustertrain cluster status {p.project.file}")
        raise


def _follow(p: Plan, run: Runner, say: Say, poll_s: float, sleep: Callable[[float], None]) -> dict[str, Any]:
    done, failed = FOLLOW[p.action]
    argv = pcluster_argv("describe-cluster", p.name, p.region)
    start, seen, misses = time.monotonic(), None, 0
    with _status_line() as show:
        while True:
            reply = run(argv)
            elapsed = _clock(time.monotonic() - start)
            if reply.not_found and done is None:
                say(f"[{elapsed}] cluster {p.name} deleted; {retained(p.project)}")
                return {}
            if reply.rc != 0:
                misses += 1
                if misses >= TRANSIENT_POLLS or reply.not_found:
                    raise CloudError(f"{reply.error_line()} (while following {p.name}; run clustertrain cluster status "
                                     f"{p.project.file} to look again)")
            else:
                misses, d = 0, reply.data
                state = (d.get("clusterStatus"), d.get("cloudFormationStackStatus"), d.get("computeFleetStatus"))
                line = f"[{elapsed}] {p.name}: {state[0]} (stack {state[1]}, compute fleet {state[2]})"
                show(line)
                if state != seen:
                    say(line)
                    seen = state
                if state[0] == done:
                    for text in ready_lines(p, d):
                        say(text)
                    return d
                if state[0] == failed:
                    raise CloudError(failure_line(p, d))
            sleep(poll_s)


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m // 60}h{m % 60:02d}m{s:02d}s" if m >= 60 else f"{m}m{s:02d}s"


def failure_line(p: Plan, d: dict[str, Any]) -> str:
    """A *_FAILED describe-cluster answer as one line: pcluster's failures[] (code: reason) and where the logs are."""
    why = "; ".join(f"{f.get('failureCode')}: {f.get('failureReason')}" for f in d.get("failures") or []) or "no reason given"
    events = shlex.join(pcluster_argv("get-cluster-stack-events", p.name, p.region))
    export = shlex.join(pcluster_argv("export-cluster-logs", p.name, p.region) + ("--output-file", f"{p.name}-logs.tar.gz"))
    return " ".join(f"cluster {p.name} {d.get('clusterStatus')} (stack {d.get('cloudFormationStackStatus')}): {why}; logs: "
                    f"{events}; {export}; CloudWatch log group /aws/parallelcluster/{p.name}-* (kept after a rollback)".split())


def _head(head: dict[str, Any]) -> str:
    return f"public IP {head.get('publicIpAddress', '-')}, private IP {head.get('privateIpAddress', '-')}"


def ready_lines(p: Plan, d: dict[str, Any]) -> list[str]:
    """What to say when a create/update finished: the head node and how to log in."""
    aws = require_aws(p.project)
    head = d.get("headNode") or {}
    out = [f"cluster {p.name} is ready ({d.get('clusterStatus')}, ParallelCluster {d.get('version')})"]
    if head:
        out.append(f"head node {head.get('instanceId')}: {_head(head)}")
    ssh = pcluster_argv("ssh", p.name, p.region) + ("-i", f"{aws.head_node.key_name}.pem")
    out.append(f"log in: {shlex.join(ssh)}  (the private key of key pair {aws.head_node.key_name})")
    if aws.head_node.ssm and head.get("instanceId"):
        out.append(f"or SSM: {shlex.join(['aws', 'ssm', 'start-session', '--target', head['instanceId'], '--region', p.region])}")
    return out


def status_lines(d: dict[str, Any]) -> list[str]:
    """A describe-cluster answer as a few lines."""
    out = [f"cluster {d.get('clusterName')} ({d.get('region')}): {d.get('clusterStatus')} "
           f"(stack {d.get('cloudFormationStackStatus')}), ParallelCluster {d.get('version')}",
           f"compute fleet: {d.get('computeFleetStatus')}"]
    head = d.get("headNode")
    if head:
        out.append(f"head node: {head.get('instanceId')} {head.get('instanceType')} {head.get('state')}, {_head(head)}")
    out.append(f"created {d.get('creationTime')}, last updated {d.get('lastUpdatedTime')}")
    out += [f"failure: {f.get('failureCode')}: {f.get('failureReason')}" for f in d.get("failures") or []]
    return out


def retained(project: "Project") -> str:
    """What a cluster delete keeps: the EBS volumes (``DeletionPolicy: Retain`` in the generated config) and every FSx
    (mounted by id: the infrastructure stack's, or existing ones; ParallelCluster owns none of them)."""
    aws = require_aws(project)
    kept = [f"EBS {e.name}" for e in aws.ebs]
    stack = [f"FSx {f.name}" for f in aws.fsx if not f.file_system_id]
    existing = [f"FSx {f.file_system_id}" for f in aws.fsx if f.file_system_id]
    parts = [f"retained: {', '.join(kept)} (DeletionPolicy Retain: delete them yourself when no longer needed)"] if kept else []
    if stack:
        parts.append(f"not touched: {', '.join(stack)} (the infrastructure stack's)")
    if existing:
        parts.append(f"not touched: {', '.join(existing)}")
    parts.append("the CloudWatch log group and the S3 buckets stay")
    return "; ".join(parts)


def lifecycle(action: str, project: "Project", *, dry_run: bool = False, suppress: Sequence[str] = (), say: Say = print,
              confirm: Callable[[str], bool] | None = None, poll_s: float = DEFAULT_POLL_S,
              run: Runner | None = None) -> dict[str, Any]:
    """Plan ``action`` for ``project``; print the plan (``dry_run``) or execute it."""
    p = plan(action, project, suppress, poll_s)
    if dry_run:
        for line in p.lines():
            say(line)
        return {}
    return execute(p, run, say, confirm, poll_s)
