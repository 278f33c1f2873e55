"""Boot phases as data: every custom action of every generated config runs where what it needs exists."""

from __future__ import annotations

import copy

import pytest

from clustertrain.cloud import build_cluster_config
from clustertrain.cloud.phases import ACTION_BY_SCRIPT, ACTIONS, HOOKS, PHASES, available, phase_findings
from clustertrain.project import validate_project
from tests.unit.cloud.conftest import scenario_raw


def _capacity_block(raw):
    raw["aws"]["queues"][0].update(capacity_type="CAPACITY_BLOCK")


def _ubuntu_spot_and_cpu(raw):
    """ubuntu2204, a g5 SPOT queue and a CPU queue whose instance has no local NVMe, other mount points."""
    raw["cluster"].update(instance_type="g5.12xlarge", partition="dev", nodes=2, gpus_per_node=4)
    for m in raw["models"]:
        m["training"].update(micro_batch=1, global_batch=8)
    raw["aws"].update(os="ubuntu2204", queues=[
        {"name": "dev", "instance_type": "g5.12xlarge", "max_count": 4, "capacity_type": "SPOT"},
        {"name": "cpu", "instance_type": "c6i.4xlarge", "max_count": 2}])
    raw["aws"]["fsx"] = [{"name": "shared", "mount_dir": "/lustre", "capacity_gb": 2400, "deployment_type": "SCRATCH_2",
                          "file_system_id": "fs-0d2b6f8a4c1e97350"}]


SHAPES = {"p5e-odcr": None, "capacity-block": _capacity_block, "ubuntu-spot-cpu": _ubuntu_spot_and_cpu}


def _config(edit) -> dict:
    raw = scenario_raw()
    if edit:
        edit(raw)
    return build_cluster_config(validate_project(raw, source="test"))


def _entries(config: dict):
    """(node kind, hook, script name, node config) of every CustomActions entry."""
    head = config["HeadNode"]
    for hook, entry in head.get("CustomActions", {}).items():
        yield "head", hook, entry["Script"].rsplit("/", 1)[-1], head
    for q in config["Scheduling"]["SlurmQueues"]:
        for hook, entry in q.get("CustomActions", {}).items():
            yield "compute", hook, entry["Script"].rsplit("/", 1)[-1], q


@pytest.mark.parametrize("shape", SHAPES)
def test_every_generated_action_runs_where_what_it_needs_exists(shape):
    config = _config(SHAPES[shape])
    entries = list(_entries(config))
    assert entries, "the config has custom actions"
    for kind, hook, script, node in entries:
        act = ACTION_BY_SCRIPT[script]  # every action is one of ours, described in the table
        assert act.node == kind and act.hook == hook
        has = {"shared_storage"} if config.get("SharedStorage") else set()
        local = node.get("ComputeSettings", {}).get("LocalStorage", node.get("LocalStorage", {}))
        has |= {"ephemeral_nvme"} if "EphemeralVolume" in local else set()
        there = available(kind, hook, has)
        assert act.needs <= there, (script, hook, act.needs - there)
        assert not act.before & there, (script, hook, act.before & there)
    assert phase_findings(config) == []


def test_a_queue_without_local_nvme_gets_no_compute_script():
    config = _config(_ubuntu_spot_and_cpu)
    dev, cpu = config["Scheduling"]["SlurmQueues"]
    assert "CustomActions" in dev and "CustomActions" not in cpu
    broken = copy.deepcopy(config)
    broken["Scheduling"]["SlurmQueues"][1]["CustomActions"] = copy.deepcopy(dev["CustomActions"])
    [f] = phase_findings(broken)
    assert f.path == "Scheduling.SlurmQueues[1].CustomActions.OnNodeConfigured"
    assert "this node's config does not provide it" in f.message and "EphemeralVolume" in f.fix


def test_the_table_says_what_pcluster_does():
    """init -> OnNodeStart -> config (mounts) -> OnNodeConfigured -> finalize (slurmd), per pcluster 3.16.1."""
    assert [p.name for p in PHASES] == ["init", "OnNodeStart", "config", "OnNodeConfigured", "finalize", "OnNodeUpdated"]
    assert HOOKS == ("OnNodeStart", "OnNodeConfigured", "OnNodeUpdated")
    assert available("compute", "OnNodeStart") == {"instance_role"}
    assert {"ephemeral_nvme", "shared_storage"} <= available("compute", "OnNodeConfigured")
    assert "slurmd" not in available("compute", "OnNodeConfigured") and "slurmctld" in available("head", "OnNodeConfigured")
    assert {a.script for a in ACTIONS} == {"head-node.sh", "compute-node.sh"}


def test_the_old_onnodestart_placement_is_refused():
    """What main shipped: compute-node.sh as OnNodeStart, waiting for /scratch that is mounted only in the config phase."""
    config = _config(None)
    q = config["Scheduling"]["SlurmQueues"][0]
    q["CustomActions"] = {"OnNodeStart": q["CustomActions"].pop("OnNodeConfigured")}
    [f] = phase_findings(config)
    assert f.level == "error" and f.path == "Scheduling.SlurmQueues[0].CustomActions.OnNodeStart"
    assert "does not exist at OnNodeStart: ParallelCluster provides it in the config phase" in f.message
    assert f.fix == "attach it to OnNodeConfigured"


def test_head_script_on_a_queue_or_before_the_mounts():
    config = _config(None)
    q = config["Scheduling"]["SlurmQueues"][0]
    q["CustomActions"] = {"OnNodeConfigured": dict(config["HeadNode"]["CustomActions"]["OnNodeConfigured"])}
    assert "is the head node's script but runs on a compute node" in phase_findings(config)[0].message
    config = _config(None)
    config["HeadNode"]["CustomActions"] = {"OnNodeStart": config["HeadNode"]["CustomActions"]["OnNodeConfigured"]}
    assert {f.message.split(" needs ")[1].split(", which does not exist")[0] for f in phase_findings(config)} >= {
        "the SharedStorage mounts (FSx for Lustre, EBS, EFS)", "slurmctld running (head node)"}
