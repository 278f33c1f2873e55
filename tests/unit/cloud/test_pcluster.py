"""Generated ParallelCluster configs against aws-parallelcluster's own schema (offline), and the
seed's hand-written YAML against it. Skips cleanly where aws-parallelcluster is not installed."""

from __future__ import annotations

import copy
import socket

import pytest
import yaml

from clustertrain.cloud import build_cluster_config, render_cluster_config, validate_cluster_config
from clustertrain.cloud.validate import schema_findings
from clustertrain.project import validate_project
from tests.unit.cloud.conftest import EXAMPLES, scenario_raw

pytest.importorskip("pcluster.schemas.cluster_schema", reason="aws-parallelcluster not installed (pip install 'clustertrain[aws]')")


def small_cluster_raw() -> dict:
    """A second, different shape: ubuntu2204, g5 spot nodes without ODCR, SCRATCH_2 + EBS, no CloudWatch."""
    raw = scenario_raw()
    raw["cluster"].update(instance_type="g5.12xlarge", partition="dev", nodes=2, gpus_per_node=4)
    for m in raw["models"]:
        m["training"].update(micro_batch=1, global_batch=8)
    raw["aws"].update(
        os="ubuntu2204",
        queues=[{"name": "dev", "instance_type": "g5.12xlarge", "max_count": 4, "capacity_type": "SPOT"},
                {"name": "cpu", "instance_type": "c6i.4xlarge", "max_count": 2}],
        fsx=[{"name": "scratch", "mount_dir": "/fsx", "capacity_gb": 2400, "deployment_type": "SCRATCH_2",
              "file_system_id": "fs-0d2b6f8a4c1e97350"}],
        ebs=[{"name": "shared", "mount_dir": "/shared", "size_gb": 200}],
        monitoring={"cloudwatch": False, "log_retention_days": 7},
    )
    raw["aws"]["head_node"]["instance_type"] = "m6i.4xlarge"
    return raw


@pytest.mark.parametrize("raw_factory", [scenario_raw, small_cluster_raw], ids=["p5e-80x7", "small-g5"])
def test_generated_config_passes_the_schema_and_our_rules(raw_factory):
    project = validate_project(raw_factory(), source="test")
    config = build_cluster_config(project)
    report = validate_cluster_config(config)
    assert report.schema_ran
    assert report.findings == [], [str(f) for f in report.findings]
    # the YAML text round-trips to the same dict and carries the tool header
    text = render_cluster_config(config, project.name)
    assert text.startswith("# AWS ParallelCluster 3 cluster config")
    assert yaml.safe_load(text) == config


def test_scenario_config_content(scenario):
    from tests.unit.cloud.conftest import DEPLOYED_CR, DEPLOYED_FSX, DEPLOYED_POLICY

    c = build_cluster_config(scenario)
    q = c["Scheduling"]["SlurmQueues"][0]
    r = q["ComputeResources"][0]
    assert (r["InstanceType"], r["MinCount"], r["MaxCount"], r["Efa"]) == ("p5e.48xlarge", 80, 80, {"Enabled": True})
    assert r["CapacityReservationTarget"] == {"CapacityReservationId": DEPLOYED_CR}
    assert q["Networking"]["PlacementGroup"] == {"Enabled": False}
    assert c["Scheduling"]["SlurmSettings"]["QueueUpdateStrategy"] == "DRAIN"
    assert q["HealthChecks"] == {"Gpu": {"Enabled": True}}
    assert q["ComputeSettings"]["LocalStorage"]["EphemeralVolume"] == {"MountDir": "/scratch"}
    fsx = [(s["MountDir"], s["FsxLustreSettings"]) for s in c["SharedStorage"]]  # every one mounted by id (none new)
    assert fsx == [(f"/fsx/{n}", {"FileSystemId": DEPLOYED_FSX[f"fsx-{n}"]}) for n in ("data", "checkpoints", "logs")]
    assert c["Monitoring"]["Logs"]["CloudWatch"] == {"Enabled": True, "RetentionInDays": 14}
    assert {"Key": "Project", "Value": "DistributedTraining"} in c["Tags"]
    assert c["HeadNode"]["CustomActions"]["OnNodeConfigured"]["Script"].endswith("/head-node.sh")
    assert list(q["CustomActions"]) == ["OnNodeConfigured"]
    assert q["CustomActions"]["OnNodeConfigured"]["Script"].endswith("/compute-node.sh")
    assert q["Iam"] == {"AdditionalIamPolicies": [{"Policy": DEPLOYED_POLICY}]}


def test_seed_yaml_fails_the_schema_with_the_known_problems():
    seed = yaml.safe_load((EXAMPLES / "seed-003-cluster.yaml").read_text())
    found = schema_findings(seed)
    got = {(f.path, f.message) for f in found}
    assert ("Image.Os", "schema: Must be one of: alinux2023, ubuntu2204, ubuntu2404, rhel8, rocky8, rhel9, rocky9") in got
    assert ("SlurmQueues", "schema: Unknown field") in got
    assert {p for p, m in got if "DeploymentType" in p and "PERSISTENT_2" in m} == {
        f"SharedStorage[{i}].FsxLustreSettings.DeploymentType" for i in range(3)}


def test_schema_catches_what_our_rules_would_not_see(scenario):
    config = copy.deepcopy(build_cluster_config(scenario))
    config["HeadNode"]["Ssh"]["AllowdIps"] = "0.0.0.0/0"  # a typo'd key: only the schema knows every key
    found = schema_findings(config)
    assert any(f.path == "HeadNode.Ssh.AllowdIps" and "Unknown field" in f.message for f in found)


def test_schema_check_makes_no_network_connection(scenario, monkeypatch):
    """pcluster's config constructor tries describe_capacity_reservations; the offline sandbox must stop it
    before any socket opens (credentials in the environment must not be picked up)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLEEXAMPLE00")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "example-secret")
    opened = []
    real = socket.socket.connect

    def record(self, address):
        opened.append(address)
        return real(self, address)

    monkeypatch.setattr(socket.socket, "connect", record)
    assert schema_findings(build_cluster_config(scenario)) == []
    # botocore may still hold credentials cached by an earlier test in this process; then its one attempt goes to
    # the sandbox's dead loopback endpoint. Nothing may go anywhere else.
    assert all(addr == ("127.0.0.1", 9) for addr in opened), opened
    import os
    assert os.environ["AWS_ACCESS_KEY_ID"] == "AKIAEXAMPLEEXAMPLE00"  # restored afterwards


# ----- models that share nodes (issue 42): memory-based scheduling and a non-exclusive queue -----

def shared_raw(**aws: object) -> dict:
    """The deployed scenario with two of its models on a 4-GPU share of one node each (models[].plan.gpus)."""
    raw = scenario_raw()
    for m in raw["models"][1:3]:
        m["plan"] = {"gpus": 4}
    raw["aws"].update(aws)
    return raw


def test_sharing_models_enable_memory_based_scheduling_and_a_shared_queue_and_pass_pcluster():
    project = validate_project(shared_raw(), source="test")
    config = build_cluster_config(project)
    assert config["Scheduling"]["SlurmSettings"]["EnableMemoryBasedScheduling"] is True
    assert [q["JobExclusiveAllocation"] for q in config["Scheduling"]["SlurmQueues"]] == [False]
    report = validate_cluster_config(config)  # aws-parallelcluster's schema and its offline validators
    assert report.schema_ran and report.findings == [], [str(f) for f in report.findings]
    loaded = schema_findings(config)
    assert loaded == []


def test_whole_node_projects_keep_parallelclusters_defaults(scenario):
    config = build_cluster_config(scenario)
    assert "EnableMemoryBasedScheduling" not in config["Scheduling"]["SlurmSettings"]
    assert [q["JobExclusiveAllocation"] for q in config["Scheduling"]["SlurmQueues"]] == [True]


def test_memory_based_scheduling_can_be_asked_for_without_shared_models():
    raw = scenario_raw()
    raw["aws"]["memory_based_scheduling"] = True
    config = build_cluster_config(validate_project(raw, source="test"))
    assert config["Scheduling"]["SlurmSettings"]["EnableMemoryBasedScheduling"] is True
    assert validate_cluster_config(config).findings == []


@pytest.mark.parametrize("aws, field", [
    ({"memory_based_scheduling": False}, "aws.memory_based_scheduling"),
    ({"queues": "exclusive"}, "aws.queues[0].exclusive"),
], ids=["memory-off", "queue-exclusive"])
def test_sharing_models_refuse_a_cluster_that_cannot_place_them(aws, field):
    from clustertrain.cloud.pcluster import check_project_aws
    from clustertrain.core.errors import ConfigError

    raw = shared_raw()
    if aws.get("queues") == "exclusive":
        raw["aws"]["queues"][0]["exclusive"] = True
    else:
        raw["aws"].update(aws)
    project = validate_project(raw, source="test")
    with pytest.raises(ConfigError) as e:
        build_cluster_config(project)
    assert str(e.value).startswith(f"{field}: ") and "model-2, model-3" in str(e.value)
    with pytest.raises(ConfigError):
        check_project_aws(project)


#: ParallelCluster's cgroup.conf as its cookbook writes it (aws/aws-parallelcluster-cookbook
#: cookbooks/aws-parallelcluster-slurm/templates/default/slurm/cgroup.conf.erb): no ConstrainDevices
COOKBOOK_CGROUP_CONF = """###
# Slurm cgroup support configuration file
###
CgroupAutomount=yes
ConstrainCores=yes
#
# WARNING!!! The slurm_parallelcluster_cgroup.conf file included below can be updated by the pcluster process.
# Please do not edit it.
include slurm_parallelcluster_cgroup.conf
"""


def _device_block(script: str) -> str:
    """head-node.sh's prelude (variables, log, write_file) and its ConstrainDevices block, without the rest."""
    prelude = script.split('if [[ -f "$ROOT$PYXIS_SO" ]]', 1)[0]
    block = script.split('CGROUP_CONF="$ROOT$SLURM_ETC/cgroup.conf"', 1)[1].split('work="$(mktemp -d)"', 1)[0]
    return prelude + 'CGROUP_CONF="$ROOT$SLURM_ETC/cgroup.conf"' + block


def test_head_node_confines_devices_when_models_share_nodes(tmp_path, scenario):
    import os
    import subprocess

    from clustertrain.cloud import render_node_scripts

    assert "ConstrainDevices" not in render_node_scripts(scenario)["head-node.sh"]  # whole-node projects: unchanged
    script = render_node_scripts(validate_project(shared_raw(), source="test"))["head-node.sh"]
    root, bin_dir = tmp_path / "root", tmp_path / "bin"
    conf = root / "opt/slurm/etc/cgroup.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text(COOKBOOK_CGROUP_CONF + "constraindevices = no\n")
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text('#!/bin/sh\necho "$@" >> "$CALLS"\n')
    (bin_dir / "scontrol").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "CLUSTERTRAIN_ROOT": str(root),
           "CLUSTERTRAIN_LOG": str(tmp_path / "head.log"), "CALLS": str(tmp_path / "calls")}
    for _ in range(2):  # safe to re-run: one setting, the cookbook's lines kept
        subprocess.run(["bash", "-c", _device_block(script)], env=env, check=True, capture_output=True)
    assert conf.read_text() == COOKBOOK_CGROUP_CONF + "ConstrainDevices=yes\n"
    assert (tmp_path / "calls").read_text() == "reconfigure\nreconfigure\n"
