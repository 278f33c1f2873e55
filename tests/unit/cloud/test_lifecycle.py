"""`clustertrain cluster create | status | update | delete`: the plans (golden ``--dry-run`` output), the refusals
before anything runs, and how pcluster's answers are read and followed.

No AWS account exists here, so the runs below are fed pcluster's answers as :class:`Recorded` replies. Sources:
* REAL_DRYRUN_OK, REAL_REJECTED, REAL_NO_CREDENTIALS, REAL_NOT_FOUND: recorded output of the real aws-parallelcluster
  3.16.1 ``pcluster`` (create-cluster --dryrun true against moto_server; describe-cluster without credentials and for
  a missing cluster), verbatim;
* the describe-cluster, update-cluster and delete answers: real-format, built from pcluster 3.16.1's response models
  (``pcluster/api/openapi/openapi.yaml``: DescribeClusterResponseContent, Failure, Change, UpdateError,
  DryrunOperationExceptionResponseContent), the failure codes and reasons of
  ``pcluster/models/cluster_resources.py`` ``get_cluster_creation_failure``, the update messages of
  ``pcluster/config/update_policy.py`` (COMPUTE_FLEET_STOP, "pcluster_stop") and the example of
  https://docs.aws.amazon.com/parallelcluster/latest/ug/pcluster.describe-cluster-v3.html.
The same commands against moto with the real pcluster: tests/integration/cloud/test_pcluster_moto.py.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from clustertrain.cli.cluster_lifecycle import register
from clustertrain.cli.common import command_group
from clustertrain.cloud.lifecycle import (
    DRYRUN_OK,
    NO_CHANGES,
    Reply,
    check_dry_run,
    execute,
    find_pcluster,
    follow,
    pcluster_argv,
    plan,
)
from clustertrain.core.errors import CloudError
from clustertrain.resolve import load_project
from tests.support.golden import check_golden
from tests.unit.cloud.conftest import DEPLOYED_FSX, EXAMPLES, scenario_raw

GOLDEN = Path(__file__).parent / "golden"
REGION = "ap-southeast-3"
app = command_group(help="test")
register(app)
runner = CliRunner()

REAL_DRYRUN_OK = {"validationMessages": [
    {"level": "INFO", "type": "DeletionPolicyValidator", "message": "The DeletionPolicy is set to Retain. The storage "
     "'fsx-data' will be retained when you remove it from the configuration when performing a cluster update or deleting the cluster."},
    {"level": "WARNING", "type": "DetailedMonitoringValidator", "message": "Detailed Monitoring is enabled for EC2 instances "
     "in your compute fleet. The Amazon EC2 console will display monitoring graphs with a 1-minute period for these "
     "instances. Note that this will increase the cost. If you want to avoid this and use basic monitoring instead, please "
     "set `Monitoring / DetailedMonitoring` to false."}],
    "message": "Request would have succeeded, but DryRun flag is set."}
REAL_REJECTED = {"configurationValidationErrors": [
    {"level": "ERROR", "type": "AdditionalIamPolicyValidator", "message": "Policy arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore not found"},
    {"level": "ERROR", "type": "InstanceTypeValidator", "message": "The instance type 'c6i.4xlarge' is not supported."},
    {"level": "INFO", "type": "DeletionPolicyValidator", "message": "The DeletionPolicy is set to Retain. The storage "
     "'fsx-data' will be retained when you remove it from the configuration when performing a cluster update or deleting the cluster."},
    {"level": "ERROR", "type": "NumberOfStorageValidator", "message": "Too many new FSx shared storage specified in the "
     "configuration. ParallelCluster supports 1 new FSx."},
    {"level": "ERROR", "type": "KeyPairValidator", "message": "The keypair '{'p5e-cluster-key'}' does not exist."}],
    "message": "Invalid cluster configuration."}
REAL_NO_CREDENTIALS = {"message": "Unable to locate credentials"}
REAL_NOT_FOUND = {"message": "Cluster 'p5e-80x7' does not exist or belongs to an incompatible ParallelCluster major version."}
HEAD = {"launchTime": "2026-11-23T10:14:02.000Z", "instanceId": "i-0f1e2d3c4b5a69788", "publicIpAddress": "198.51.100.44",
        "instanceType": "c6i.4xlarge", "state": "running", "privateIpAddress": "10.0.0.196"}


def described(status: str, stack: str | None = None, fleet: str = "UNKNOWN", **extra) -> tuple[int, dict]:
    """A describe-cluster answer (DescribeClusterResponseContent's required fields and the ones given)."""
    return 0, {"creationTime": "2026-11-23T10:12:40.101Z", "version": "3.16.1", "clusterConfiguration": {"url": "https://x"},
               "tags": [{"value": "3.16.1", "key": "parallelcluster:version"}], "cloudFormationStackStatus": stack or status,
               "clusterName": "p5e-80x7", "computeFleetStatus": fleet, "lastUpdatedTime": "2026-11-23T10:12:40.101Z",
               "cloudformationStackArn": f"arn:aws:cloudformation:{REGION}:482913650271:stack/p5e-80x7/5a3e",
               "region": REGION, "clusterStatus": status, "scheduler": {"type": "slurm"}, **extra}


class Recorded:
    """pcluster's answers per operation, in order; records every argv it is asked to run."""

    def __init__(self, **answers: list[tuple[int, dict]]) -> None:
        self.answers = {op.replace("_", "-"): list(a) for op, a in answers.items()}
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, argv):
        self.calls.append(tuple(argv))
        rc, data = self.answers[argv[1]].pop(0)
        return Reply(tuple(argv), rc, data)


@pytest.fixture
def project_file(tmp_path) -> Path:
    path = tmp_path / "p5e-80x7.yaml"
    path.write_text(yaml.safe_dump(scenario_raw(), sort_keys=False))
    return path


@pytest.fixture
def flagship(tmp_path, monkeypatch) -> Path:
    """examples/p5e-80x7.yaml copied to tmp/examples/, cwd tmp: the relative paths of the golden files."""
    (tmp_path / "examples").mkdir()
    shutil.copy(EXAMPLES / "p5e-80x7.yaml", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    return Path("examples/p5e-80x7.yaml")


@pytest.mark.parametrize("action", ["create", "update", "delete", "status"])
def test_dry_run_prints_every_command_and_writes_nothing(flagship, action):
    r = runner.invoke(app, [action, str(flagship), "--dry-run"])
    assert r.exit_code == 0, r.output
    check_golden(GOLDEN / f"{action}-dry-run.txt", r.output)
    assert [p.name for p in flagship.parent.iterdir()] == ["p5e-80x7.yaml"]


def test_create_dry_run_passes_set_overrides_on_and_quotes_them(flagship):
    r = runner.invoke(app, ["create", str(flagship), "--dry-run", "--set", "aws.tags.Owner=ml team",
                            "--suppress-validator", "KeyPairValidator", "--suppress-validator", "type:EfaValidator"])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0] == "clustertrain cluster config examples/p5e-80x7.yaml -o examples/p5e-80x7.cluster.yaml --set 'aws.tags.Owner=ml team'"
    assert lines[3].endswith("--dryrun true --suppress-validators type:KeyPairValidator type:EfaValidator  "
                             "# pcluster's validators; stops on errors")


@pytest.mark.parametrize("dry", [[], ["--dry-run"]])
def test_missing_key_pair_name_is_one_line_exit_2_and_nothing_runs(project_file, dry):
    r = runner.invoke(app, ["create", str(project_file), "--set", "aws.head_node.key_name=null", *dry])
    assert r.exit_code == 2
    assert r.output.startswith("error: cluster create refused: aws.head_node.key_name: no EC2 key pair is named")
    assert r.output.count("\n") == 1
    assert [p.name for p in project_file.parent.iterdir()] == ["p5e-80x7.yaml"]


def test_example_ids_refuse_a_real_create_before_anything_is_written(flagship):
    r = runner.invoke(app, ["create", str(flagship)])
    assert r.exit_code == 2 and r.output.count("\n") == 1
    assert r.output.startswith("error: aws.example_ids is true: the project's ids are documentation examples")
    assert [p.name for p in flagship.parent.iterdir()] == ["p5e-80x7.yaml"]


def test_pcluster_not_installed(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(CloudError, match=r"^pcluster not found: install the aws extra: pip install 'clustertrain\[aws\]'$"):
        find_pcluster()


def test_argv():
    assert pcluster_argv("create-cluster", "c1", REGION, Path("a b/c.yaml"), True, ["ALL"]) == (
        "pcluster", "create-cluster", "--cluster-name", "c1", "--cluster-configuration", "a b/c.yaml",
        "--region", REGION, "--dryrun", "true", "--suppress-validators", "ALL")
    assert pcluster_argv("describe-cluster", "c1", REGION) == ("pcluster", "describe-cluster", "--cluster-name", "c1", "--region", REGION)


def test_replies_as_lines():
    argv = pcluster_argv("create-cluster", "p5e-80x7", REGION, Path("c.yaml"), True)
    ok = Reply(argv, 1, REAL_DRYRUN_OK)  # a passing dry run exits 1 too
    assert ok.dryrun_ok and ok.message == DRYRUN_OK
    assert ok.notes()[1].startswith("pcluster warning: Detailed Monitoring is enabled") and ok.notes()[1].endswith("[DetailedMonitoringValidator]")
    bad = Reply(argv, 1, REAL_REJECTED)
    assert not bad.dryrun_ok
    assert bad.error_line() == ("pcluster create-cluster rejected the config: AdditionalIamPolicyValidator: Policy "
                                "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore not found (and 3 more)")  # INFO not counted
    describe = pcluster_argv("describe-cluster", "p5e-80x7", REGION)
    assert Reply(describe, 1, REAL_NO_CREDENTIALS).error_line() == "pcluster describe-cluster: Unable to locate credentials"
    assert Reply(describe, 1, REAL_NOT_FOUND).not_found
    silent = Reply(describe, 1, {}, "Traceback ...\nBrokenPipeError")
    assert "failed (exit 1) without a JSON answer: Traceback ... BrokenPipeError; see ~/.parallelcluster/pcluster-cli.log" in silent.error_line()


def test_follow_create_until_complete(project_file):
    p = plan("create", load_project(project_file))
    run = Recorded(describe_cluster=[described("CREATE_IN_PROGRESS"), described("CREATE_IN_PROGRESS"),
                                     described("CREATE_IN_PROGRESS", fleet="STARTING"),
                                     described("CREATE_COMPLETE", fleet="RUNNING", headNode=HEAD)])
    said, slept = [], []
    d = follow(p, run, said.append, poll_s=7, sleep=slept.append)
    assert d["clusterStatus"] == "CREATE_COMPLETE" and slept == [7, 7, 7]
    changes = [s.split("] ", 1)[1] for s in said if s.startswith("[")]
    assert changes == ["p5e-80x7: CREATE_IN_PROGRESS (stack CREATE_IN_PROGRESS, compute fleet UNKNOWN)",
                       "p5e-80x7: CREATE_IN_PROGRESS (stack CREATE_IN_PROGRESS, compute fleet STARTING)",
                       "p5e-80x7: CREATE_COMPLETE (stack CREATE_COMPLETE, compute fleet RUNNING)"]
    assert "head node i-0f1e2d3c4b5a69788: public IP 198.51.100.44, private IP 10.0.0.196" in said
    assert "log in: pcluster ssh --cluster-name p5e-80x7 --region ap-southeast-3 -i p5e-cluster-key.pem  " \
           "(the private key of key pair p5e-cluster-key)" in said
    assert "or SSM: aws ssm start-session --target i-0f1e2d3c4b5a69788 --region ap-southeast-3" in said


def test_follow_stops_at_a_failure_with_its_reason_and_the_logs(project_file):
    p = plan("create", load_project(project_file))
    failure = {"failureCode": "OnNodeConfiguredExecutionFailure", "failureReason": "Failed to execute OnNodeConfigured script."}
    run = Recorded(describe_cluster=[described("CREATE_IN_PROGRESS"),
                                     described("CREATE_FAILED", "ROLLBACK_IN_PROGRESS", failures=[failure])])
    with pytest.raises(CloudError) as e:
        follow(p, run, lambda s: None, poll_s=0, sleep=lambda s: None)
    msg = str(e.value)
    assert msg.startswith("cluster p5e-80x7 CREATE_FAILED (stack ROLLBACK_IN_PROGRESS): OnNodeConfiguredExecutionFailure: "
                          "Failed to execute OnNodeConfigured script.; logs: pcluster get-cluster-stack-events "
                          "--cluster-name p5e-80x7 --region ap-southeast-3; pcluster export-cluster-logs")
    assert "CloudWatch log group /aws/parallelcluster/p5e-80x7-*" in msg and "\n" not in msg


def test_follow_rides_out_transient_errors_but_not_three_in_a_row(project_file):
    p = plan("create", load_project(project_file))
    throttled = (1, {"message": "Rate exceeded"})
    ok = follow(p, Recorded(describe_cluster=[throttled, throttled, described("CREATE_COMPLETE", headNode=HEAD)]),
                lambda s: None, poll_s=0, sleep=lambda s: None)
    assert ok["clusterStatus"] == "CREATE_COMPLETE"
    with pytest.raises(CloudError, match="^pcluster describe-cluster: Rate exceeded \\(while following p5e-80x7"):
        follow(p, Recorded(describe_cluster=[throttled] * 3), lambda s: None, poll_s=0, sleep=lambda s: None)


def test_status(project_file):
    p = plan("status", load_project(project_file))
    said = []
    execute(p, Recorded(describe_cluster=[described("UPDATE_COMPLETE", fleet="RUNNING", headNode=HEAD)]), said.append)
    assert said == ["cluster p5e-80x7 (ap-southeast-3): UPDATE_COMPLETE (stack UPDATE_COMPLETE), ParallelCluster 3.16.1",
                    "compute fleet: RUNNING",
                    "head node: i-0f1e2d3c4b5a69788 c6i.4xlarge running, public IP 198.51.100.44, private IP 10.0.0.196",
                    "created 2026-11-23T10:12:40.101Z, last updated 2026-11-23T10:12:40.101Z"]
    with pytest.raises(CloudError, match="^cluster p5e-80x7 does not exist in ap-southeast-3; create it: clustertrain cluster create "):
        execute(p, Recorded(describe_cluster=[(1, REAL_NOT_FOUND)]), said.append)


def test_delete_asks_then_follows_until_gone_and_says_what_stays(project_file):
    p = plan("delete", load_project(project_file))
    run = Recorded(describe_cluster=[described("CREATE_COMPLETE", fleet="RUNNING")])
    with pytest.raises(CloudError, match="not deleted \\(not confirmed; --yes skips the question\\)"):
        execute(p, run, lambda s: None, confirm=lambda q: False)
    assert [c[1] for c in run.calls] == ["describe-cluster"]  # no delete-cluster
    asked, said = [], []
    run = Recorded(describe_cluster=[described("CREATE_COMPLETE"), described("DELETE_IN_PROGRESS"), (1, REAL_NOT_FOUND)],
                   delete_cluster=[(0, {"cluster": {"clusterName": "p5e-80x7", "clusterStatus": "DELETE_IN_PROGRESS"}})])
    assert execute(p, run, said.append, confirm=lambda q: asked.append(q) or True, poll_s=0, sleep=lambda s: None) == {}
    assert asked == ["delete cluster p5e-80x7 in ap-southeast-3?"]
    assert [c[1] for c in run.calls] == ["describe-cluster", "delete-cluster", "describe-cluster", "describe-cluster"]
    fsx = ", ".join(f"FSx {i}" for i in DEPLOYED_FSX.values())  # mounted by id: never ParallelCluster's to delete
    assert said[-1].endswith(f"cluster p5e-80x7 deleted; not touched: {fsx}; the CloudWatch log group and the S3 buckets stay")


def test_update_with_no_changes_stops_after_the_dry_run(project_file):
    p = plan("update", load_project(project_file))
    run, said = Recorded(update_cluster=[(1, {"message": NO_CHANGES})]), []
    assert execute(p, run, said.append) == {}
    assert [c[-2:] for c in run.calls] == [("--dryrun", "true")]  # no upload, no update
    assert said[-1] == "no changes: cluster p5e-80x7 already runs this config; nothing was updated"


def test_update_that_needs_the_fleet_stopped_names_the_command(project_file):
    p = plan("update", load_project(project_file, ["aws.scaledown_idletime=20"]))
    error = {"parameter": "Scheduling.SlurmSettings.ScaledownIdletime", "currentValue": "10", "requestedValue": "20",
             "message": "All compute nodes must be stopped. Stop the compute fleet with the pcluster update-compute-fleet command"}
    change = {k: error[k] for k in ("parameter", "currentValue", "requestedValue")}
    run = Recorded(update_cluster=[(1, {"message": "Update failure", "updateValidationErrors": [error], "changeSet": [change]})])
    with pytest.raises(CloudError) as e:
        execute(p, run, lambda s: None)
    assert str(e.value) == (
        "pcluster update-cluster rejected the config: Scheduling.SlurmSettings.ScaledownIdletime: All compute nodes must be "
        "stopped. Stop the compute fleet with the pcluster update-compute-fleet command (current 10, requested 20); this "
        "change needs the compute fleet stopped (its running jobs end): pcluster update-compute-fleet --cluster-name "
        "p5e-80x7 --region ap-southeast-3 --status STOP_REQUESTED, wait for STOPPED (clustertrain cluster status), then "
        "update again")


def test_update_dry_run_shows_the_change_set_and_the_queue_update_strategy(project_file):
    p = plan("update", load_project(project_file))
    changes = [{"parameter": "Scheduling.SlurmQueues[gpu-queue].ComputeResources[p5e-48xlarge].MaxCount",
                "currentValue": "80", "requestedValue": "64"}]
    said = []
    assert check_dry_run(p, Reply(("pcluster", "update-cluster"), 1, {"changeSet": changes, "message": DRYRUN_OK}), said.append)
    assert said == ["queue update strategy: DRAIN (a queue targets reserved capacity)",
                    "change: Scheduling.SlurmQueues[gpu-queue].ComputeResources[p5e-48xlarge].MaxCount: 80 -> 64"]
    unreserved = load_project(project_file, ["aws.queues.0.capacity_reservation_id=null"])
    said.clear()
    check_dry_run(plan("update", unreserved), Reply(("pcluster", "update-cluster"), 1, {"message": DRYRUN_OK}), said.append)
    assert said == ["queue update strategy: COMPUTE_FLEET_STOP (ParallelCluster default)"]


def test_ctrl_c_stops_following_only_and_says_how_to_look_again(project_file):
    p = plan("create", load_project(project_file))
    said = []

    def interrupt(_seconds):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        follow(p, Recorded(describe_cluster=[described("CREATE_IN_PROGRESS")]), said.append, poll_s=1, sleep=interrupt)
    assert said[-1] == f"stopped following; the create goes on in CloudFormation: clustertrain cluster status {project_file}"
