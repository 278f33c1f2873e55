"""clustertrain's own rules on ParallelCluster configs: a table of broken configs, each with the
path and message it must produce. Every case starts from the valid generated scenario config."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from clustertrain.cloud import build_cluster_config, check_cluster_config, validate_cluster_config
from clustertrain.cloud.catalog import InstanceCatalog, load_catalog

Q = ("Scheduling", "SlurmQueues", 0)
CR = Q + ("ComputeResources", 0)


def _set(cfg: dict, path: tuple, value) -> None:
    node = cfg
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value


def _del(cfg: dict, path: tuple) -> None:
    node = cfg
    for p in path[:-1]:
        node = node[p]
    del node[path[-1]]


def _fsx(i: int) -> tuple:
    return ("SharedStorage", i, "FsxLustreSettings")


def _move_queues(c: dict) -> None:
    c["SlurmQueues"] = c["Scheduling"].pop("SlurmQueues")


def _dup_mount(c: dict) -> None:
    c["SharedStorage"][2]["MountDir"] = c["SharedStorage"][0]["MountDir"]


def _cpu_queue_with_gpu_checks(c: dict) -> None:
    _set(c, CR + ("InstanceType",), "c6i.4xlarge")
    _set(c, CR + ("Efa", "Enabled"), False)


# (id, edit, level, expected path, expected text in the message or fix)
CASES = [
    ("os-alinux2", lambda c: _set(c, ("Image", "Os"), "alinux2"), "error", "Image.Os", "Amazon Linux 2 is not supported"),
    ("queues-top-level", _move_queues, "error", "SlurmQueues", "move it under Scheduling"),
    ("iam-top-level", lambda c: _set(c, ("Iam",), {"AdditionalIamPolicies": [{"Policy": "arn:aws:iam::aws:policy/X"}]}),
     "error", "Iam.AdditionalIamPolicies", "HeadNode.Iam"),
    ("fsx-persistent", lambda c: _set(c, _fsx(0) + ("DeploymentType",), "PERSISTENT"),
     "error", "SharedStorage[0].FsxLustreSettings.DeploymentType", "PERSISTENT_2"),
    ("fsx-capacity-step", lambda c: _set(c, _fsx(0) + ("StorageCapacity",), 3000),
     "error", "SharedStorage[0].FsxLustreSettings.StorageCapacity", "1200 or a multiple of 2400"),
    ("fsx-capacity-scratch1", lambda c: (_set(c, _fsx(1) + ("DeploymentType",), "SCRATCH_1"), _del(c, _fsx(1) + ("PerUnitStorageThroughput",)),
                                         _set(c, _fsx(1) + ("StorageCapacity",), 4800)),
     "error", "SharedStorage[1].FsxLustreSettings.StorageCapacity", "multiple of 3600"),
    ("fsx-throughput-p2", lambda c: _set(c, _fsx(2) + ("PerUnitStorageThroughput",), 200),
     "error", "SharedStorage[2].FsxLustreSettings.PerUnitStorageThroughput", "125, 250, 500, 1000"),
    ("fsx-throughput-p1", lambda c: _set(c, _fsx(0) + ("DeploymentType",), "PERSISTENT_1"),
     "error", "SharedStorage[0].FsxLustreSettings.PerUnitStorageThroughput", "50, 100, 200"),
    ("fsx-throughput-scratch", lambda c: _set(c, _fsx(0) + ("DeploymentType",), "SCRATCH_2"),
     "error", "SharedStorage[0].FsxLustreSettings.PerUnitStorageThroughput", "remove it"),
    ("min-gt-max", lambda c: _set(c, CR + ("MinCount",), 90), "error",
     "Scheduling.SlurmQueues[0].ComputeResources[0].MaxCount", "MinCount (90) is greater than MaxCount (80)"),
    ("negative-count", lambda c: _set(c, CR + ("MinCount",), -1), "error",
     "Scheduling.SlurmQueues[0].ComputeResources[0].MinCount", "integer >= 0"),
    ("efa-on-non-efa", lambda c: _set(c, CR + ("InstanceType",), "c6i.4xlarge"), "error",
     "Scheduling.SlurmQueues[0].ComputeResources[0].Efa.Enabled", "does not support EFA"),
    ("efa-off-on-p5e", lambda c: _set(c, CR + ("Efa", "Enabled"), False), "warning",
     "Scheduling.SlurmQueues[0].ComputeResources[0].Efa.Enabled", "supports EFA but it is not enabled"),
    ("gpu-checks-on-cpu", _cpu_queue_with_gpu_checks, "error", "Scheduling.SlurmQueues[0].HealthChecks.Gpu.Enabled", "no NVIDIA GPU"),
    ("duplicate-mount", _dup_mount, "error", "SharedStorage[2].MountDir", "already used by SharedStorage[0]"),
    ("reserved-mount", lambda c: _set(c, ("SharedStorage", 1, "MountDir"), "/home"), "error", "SharedStorage[1].MountDir", "system"),
    ("queue-name-upper", lambda c: _set(c, Q + ("Name",), "GPU_Queue"), "error", "Scheduling.SlurmQueues[0].Name", "gpu-queue"),
    ("queue-name-long", lambda c: _set(c, Q + ("Name",), "a" * 26), "error", "Scheduling.SlurmQueues[0].Name", "1-25 lowercase"),
    ("queue-name-default", lambda c: _set(c, Q + ("Name",), "default"), "error", "Scheduling.SlurmQueues[0].Name", "not 'default'"),
    ("resource-name", lambda c: _set(c, CR + ("Name",), "p5e.48xlarge"), "error",
     "Scheduling.SlurmQueues[0].ComputeResources[0].Name", "compute resource name"),
    ("unknown-instance", lambda c: _set(c, CR + ("InstanceType",), "p5e.48xlarg"), "error",
     "Scheduling.SlurmQueues[0].ComputeResources[0].InstanceType", "unknown instance type 'p5e.48xlarg'"),
    ("head-too-small", lambda c: (_set(c, ("HeadNode", "InstanceType"), "c5.2xlarge"), _set(c, CR + ("MaxCount",), 300)),
     "warning", "HeadNode.InstanceType", "8 vCPUs for up to 300 compute nodes"),
    ("head-burstable", lambda c: _set(c, ("HeadNode", "InstanceType"), "t3.medium"), "warning", "HeadNode.InstanceType", "burstable"),
    ("head-bad-type", lambda c: _set(c, ("HeadNode", "InstanceType"), "c6i.4xlarg"), "error", "HeadNode.InstanceType", "not an EC2 instance type"),
    ("missing-key", lambda c: _del(c, ("HeadNode", "Ssh", "KeyName")), "error", "HeadNode.Ssh.KeyName", "key pair"),
    ("missing-subnet", lambda c: _del(c, ("HeadNode", "Networking", "SubnetId")), "error", "HeadNode.Networking.SubnetId", "subnet"),
    ("missing-queue-subnet", lambda c: _set(c, Q + ("Networking", "SubnetIds"), []), "error",
     "Scheduling.SlurmQueues[0].Networking.SubnetIds", "PrivateSubnetId"),
    ("spot-with-odcr", lambda c: _set(c, Q + ("CapacityType",), "SPOT"), "error",
     "Scheduling.SlurmQueues[0].ComputeResources[0].CapacityReservationTarget", "SPOT"),
    ("placeholder-cr", lambda c: _set(c, CR + ("CapacityReservationTarget", "CapacityReservationId"), "cr-xxxxxxxxxxxxx"), "error",
     "Scheduling.SlurmQueues[0].ComputeResources[0].CapacityReservationTarget.CapacityReservationId", "placeholder"),
    ("secret-in-config", lambda c: _set(c, ("Tags", 0, "Value"), "AKIA" + "ABCDEFGHIJKLMNOP"), "error", "Tags[0].Value", "access key"),
    ("efa-without-placement", lambda c: _del(c, CR + ("CapacityReservationTarget",)), "warning",
     "Scheduling.SlurmQueues[0].Networking.PlacementGroup.Enabled", "without a cluster placement group"),
    ("placement-beside-odcr", lambda c: _set(c, Q + ("Networking", "PlacementGroup", "Enabled"), True), "warning",
     "Scheduling.SlurmQueues[0].Networking.PlacementGroup.Enabled", "insufficient capacity"),
    ("placement-beside-capacity-block", lambda c: (_set(c, Q + ("CapacityType",), "CAPACITY_BLOCK"),
                                                   _set(c, Q + ("Networking", "PlacementGroup", "Enabled"), True)), "warning",
     "Scheduling.SlurmQueues[0].Networking.PlacementGroup.Enabled", "beside a Capacity Block"),
    ("doc-subnet-id", lambda c: _set(c, ("HeadNode", "Networking", "SubnetId"), "subnet-0123456789abcdef0"), "error",
     "HeadNode.Networking.SubnetId", "AWS documentation"),
    ("doc-subnet-id-reversed", lambda c: _set(c, Q + ("Networking", "SubnetIds"), ["subnet-0fedcba9876543210"]), "error",
     "Scheduling.SlurmQueues[0].Networking.SubnetIds[0]", "AWS documentation"),
    ("doc-sg-id", lambda c: _set(c, Q + ("Networking", "AdditionalSecurityGroups"), ["sg-0123456789abcdef0"]), "error",
     "Scheduling.SlurmQueues[0].Networking.AdditionalSecurityGroups[0]", "AWS documentation"),
    ("doc-cr-id", lambda c: _set(c, CR + ("CapacityReservationTarget", "CapacityReservationId"), "cr-0123456789abcdef0"), "error",
     "Scheduling.SlurmQueues[0].ComputeResources[0].CapacityReservationTarget.CapacityReservationId", "AWS documentation"),
    ("doc-account-in-arn", lambda c: _set(c, Q + ("Iam", "AdditionalIamPolicies"), [{"Policy": "arn:aws:iam::123456789012:policy/x"}]),
     "error", "Scheduling.SlurmQueues[0].Iam.AdditionalIamPolicies[0].Policy", "AWS documentation"),
    ("compute-script-at-on-node-start", lambda c: _set(c, Q + ("CustomActions",), {"OnNodeStart": c["Scheduling"]["SlurmQueues"][0]
                                                                                 ["CustomActions"]["OnNodeConfigured"]}),
     "error", "Scheduling.SlurmQueues[0].CustomActions.OnNodeStart", "does not exist at OnNodeStart"),
    ("bad-region", lambda c: _set(c, ("Region",), "ap-southeast-33"), "error", "Region", "not an AWS region"),
]


@pytest.fixture
def good_config(scenario) -> dict:
    """The generated config, its file systems written as new ones (how a hand-written config has ParallelCluster
    create them; clustertrain mounts every one by id, so its rules for new ones are tested on this form)."""
    cfg = build_cluster_config(scenario)
    for s, f in zip(cfg["SharedStorage"], scenario.aws.fsx):
        s["FsxLustreSettings"] = {"StorageCapacity": f.capacity_gb, "DeploymentType": f.deployment_type,
                                  "PerUnitStorageThroughput": f.effective_throughput, "DataCompressionType": "LZ4"}
    return cfg


def test_generated_scenario_config_has_no_findings(good_config):
    assert check_cluster_config(good_config) == []


def test_table_has_at_least_15_cases():
    assert len(CASES) >= 15 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case_id,edit,level,path,text", CASES, ids=[c[0] for c in CASES])
def test_broken_config_gets_its_message(good_config, case_id, edit, level, path, text):
    cfg = copy.deepcopy(good_config)
    edit(cfg)
    findings = check_cluster_config(cfg)
    matching = [f for f in findings if f.path == path and f.level == level and (text in f.message or text in f.fix)]
    assert matching, f"{case_id}: expected {level} at {path} mentioning {text!r}; got {[str(f) for f in findings]}"
    assert all(f.fix for f in findings), "every finding says how to fix it"
    if level == "warning":
        assert validate_cluster_config(cfg, use_schema=False).ok


def test_region_without_the_instance_where_the_catalog_knows(good_config):
    cat = load_catalog()
    p5e = dataclasses.replace(cat.instances["p5e.48xlarge"], regions=("us-east-1", "us-east-2"))
    catalog = InstanceCatalog({**cat.instances, "p5e.48xlarge": p5e}, cat.regions)
    findings = check_cluster_config(good_config, catalog)
    assert [str(f) for f in findings] == [
        "error: Scheduling.SlurmQueues[0].ComputeResources[0].InstanceType: p5e.48xlarge is not offered in ap-southeast-3; "
        "fix: use one of its regions (us-east-1, us-east-2) or another type"
    ]


def test_seed_yaml_reports_each_real_problem(seed_config):
    report = validate_cluster_config(seed_config, use_schema=False)
    texts = {(f.path, f.message) for f in report.errors}
    paths = {p for p, _ in texts}
    assert "Image.Os" in paths and any("alinux2" in m for p, m in texts if p == "Image.Os")
    assert "SlurmQueues" in paths
    assert "Iam.AdditionalIamPolicies" in paths
    for i in range(3):
        assert f"SharedStorage[{i}].FsxLustreSettings.DeploymentType" in paths
    for p in ("HeadNode.Networking.SubnetId", "HeadNode.Ssh.KeyName",
              "SlurmQueues[0].ComputeResources[0].CapacityReservationTarget.CapacityReservationId"):
        assert p in paths, p
    assert not report.ok


@pytest.fixture
def seed_config() -> dict:
    import yaml

    from tests.unit.cloud.conftest import EXAMPLES

    return yaml.safe_load((EXAMPLES / "seed-003-cluster.yaml").read_text())
