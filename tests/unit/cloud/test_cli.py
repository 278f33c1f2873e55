"""`clustertrain cluster ...` end to end through the typer app: files written only when valid,
exit 2 with one line on user mistakes, no secrets or account ids in anything generated."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from clustertrain.cli.cluster import app
from tests.unit.cloud.conftest import EXAMPLES, scenario_raw

runner = CliRunner()


@pytest.fixture
def project_file(tmp_path) -> Path:
    path = tmp_path / "p5e-80x7.yaml"
    path.write_text(yaml.safe_dump(scenario_raw(), sort_keys=False))
    return path


def test_config_writes_a_valid_file(project_file, tmp_path):
    out = tmp_path / "out" / "cluster.yaml"
    r = runner.invoke(app, ["config", str(project_file), "-o", str(out), "--no-schema"])
    assert r.exit_code == 0, r.output
    assert out.read_text().startswith("# AWS ParallelCluster 3 cluster config")
    assert "only clustertrain's own rules ran" in r.output
    v = runner.invoke(app, ["validate", str(out), "--no-schema"])
    assert v.exit_code == 0, v.output
    assert "0 error(s), 0 warning(s)" in v.output


@pytest.mark.parametrize("override,text", [
    ("aws.queues.0.instance_type=p5e.48xlarg", "unknown instance type 'p5e.48xlarg'"),
    ("aws.queues.0.min_count=-3", "aws.queues[0].min_count"),
    ("aws.fsx.0.capacity_gb=5000 aws.fsx.0.file_system_id=null", "capacity_gb 5000 is not valid for PERSISTENT_2"),
    ("aws.network.public_subnet_id=null", "aws.network.public_subnet_id: the head node subnet is missing"),
    ("aws.head_node.key_name=null", "aws.head_node.key_name: no EC2 key pair"),
    ("aws.queues.0.min_count=0", None),

])
def test_bad_input_exits_2_and_leaves_the_old_file(project_file, tmp_path, override, text):
    out = tmp_path / "cluster.yaml"
    out.write_text("previous\n")
    args = ["config", str(project_file), "-o", str(out), *(a for o in override.split() for a in ("--set", o)), "--no-schema"]
    if text is None:  # a Capacity Block with MinCount 0: only aws-parallelcluster's own validator knows, so run it
        args = [*args[:-1], "--set", "aws.queues.0.capacity_type=CAPACITY_BLOCK"]  # and no --no-schema
        text = "aws.queues[0].min_count: Max count must be set to the same value of min count when using Capacity Block"
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert text in r.output
    assert r.output.startswith("error: ") and r.output.count("\n") == 1
    assert out.read_text() == "previous\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".cluster")] == []


def test_validate_seed_yaml_exits_2_with_each_problem():
    r = runner.invoke(app, ["validate", str(EXAMPLES / "seed-003-cluster.yaml"), "--no-schema"])
    assert r.exit_code == 2
    for text in ("Image.Os: Os 'alinux2' is not supported", "SlurmQueues: SlurmQueues is at the top level",
                 "SharedStorage[0].FsxLustreSettings.DeploymentType: 'PERSISTENT' is not an FSx for Lustre deployment type",
                 "Iam.AdditionalIamPolicies", "'your-keypair-name' is a placeholder"):
        assert text in r.output, text


def test_validate_a_project_checks_its_generated_config(project_file):
    r = runner.invoke(app, ["validate", str(project_file), "--no-schema"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["validate", str(project_file), "--no-schema", "--set", "aws.fsx.1.throughput=300",
                               "--set", "aws.fsx.1.file_system_id=null"])  # one the stack creates
    assert r.exit_code == 2 and "throughput 300 is not valid for PERSISTENT_2" in r.output


def test_without_aws_parallelcluster_it_says_only_our_rules_ran(project_file, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pcluster.schemas.cluster_schema", None)  # as if not installed
    r = runner.invoke(app, ["validate", str(EXAMPLES / "seed-003-cluster.yaml")])
    assert r.exit_code == 2
    assert "aws-parallelcluster is not installed: only clustertrain's own rules ran" in r.output
    assert "[aws-parallelcluster]" not in r.output


def test_validate_missing_file_is_one_line(tmp_path):
    r = runner.invoke(app, ["validate", str(tmp_path / "nope.yaml")])
    assert r.exit_code == 2 and "file not found" in r.output


def test_no_secret_or_account_id_in_generated_files(project_file, tmp_path):
    out = tmp_path / "gen"
    assert runner.invoke(app, ["config", str(project_file), "-o", str(out / "cluster.yaml"), "--no-schema"]).exit_code == 0
    assert runner.invoke(app, ["infra", "template", str(project_file), "-o", str(out / "infra.yaml")]).exit_code == 0
    r = runner.invoke(app, ["scripts", str(project_file), "-o", str(out / "scripts")])
    assert r.exit_code == 0, r.output
    assert "aws s3 cp --recursive" in r.output
    files = sorted(p for p in out.rglob("*") if p.is_file())
    assert [p.name for p in files] == ["cluster.yaml", "infra.yaml", "compute-node.sh", "head-node.sh", "setup-dirs.sh"]
    from tests.unit.cloud.conftest import DEPLOYED_POLICY

    for p in files:
        text = p.read_text().replace(DEPLOYED_POLICY, "")  # the one account id the project file itself holds
        assert not re.search(r"(?<![0-9a-f-])\d{12}(?![0-9a-f])", text), p
        assert not re.search(r"(AKIA|ASIA)[0-9A-Z]{16}|PRIVATE KEY|aws_secret_access_key", text, re.I), p
        assert "clustertrain" in "".join(text.splitlines()[:3]), f"{p} names the tool in its header"


@pytest.mark.parametrize("override,text", [
    ("aws.memory_based_scheduling=false", "aws.memory_based_scheduling: false while models share nodes (model-2, model-3"),
    ("aws.queues.0.exclusive=true", "aws.queues[0].exclusive: true on queue 'gpu-queue', which runs models that share nodes"),
])
def test_a_cluster_that_cannot_place_shared_models_exits_2(project_file, tmp_path, override, text):
    """Models on a share of a node (models[].plan.gpus, issue 42) need memory-based scheduling and a queue that is not
    JobExclusiveAllocation: turning either off is one line, exit 2, and nothing written."""
    out = tmp_path / "cluster.yaml"
    out.write_text("previous\n")
    shares = [a for i in (1, 2) for a in ("--set", f"models.{i}.plan.gpus=4")]
    ok = runner.invoke(app, ["config", str(project_file), "-o", str(out), *shares])
    assert ok.exit_code == 0, ok.output
    written = yaml.safe_load(out.read_text())
    assert written["Scheduling"]["SlurmSettings"]["EnableMemoryBasedScheduling"] is True
    assert written["Scheduling"]["SlurmQueues"][0]["JobExclusiveAllocation"] is False
    out.write_text("previous\n")
    r = runner.invoke(app, ["config", str(project_file), "-o", str(out), *shares, "--set", override, "--no-schema"])
    assert r.exit_code == 2, r.output
    assert text in r.output and r.output.startswith("error: ") and r.output.count("\n") == 1
    assert out.read_text() == "previous\n"
