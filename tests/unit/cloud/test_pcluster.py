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
