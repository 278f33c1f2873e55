"""The emulated cluster's shape comes from the ParallelCluster config clustertrain generates (no Slurm needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from clustertrain.cloud.pcluster import build_cluster_config
from clustertrain.core.errors import LaunchError
from clustertrain.rehearsal.shape import cluster_shape, gpu_type, with_nodes
from clustertrain.project import validate_project
from clustertrain.resolve import load_project

FLAGSHIP = Path(__file__).resolve().parents[3] / "examples" / "p5e-80x7.yaml"


def test_flagship_shape_is_pclusters_static_nodes_with_the_instance_facts():
    project = load_project(FLAGSHIP)
    shape = cluster_shape(project)
    (queue,) = shape.queues
    assert queue.name == "gpu-queue" and shape.node_count == 80
    (group,) = queue.groups
    assert group.names[0] == "gpu-queue-st-p5e-48xlarge-1" and group.names[-1] == "gpu-queue-st-p5e-48xlarge-80"
    assert (group.cpus, group.gpus, group.gpu_type) == (192, 8, "h200")
    assert group.memory_mb == int(2048 * 1024 * 0.95)  # ParallelCluster declares 95% of the instance's memory
    assert queue.ephemeral == "/scratch"
    assert [(a.hook, a.name) for a in queue.actions] == [("OnNodeConfigured", "compute-node.sh")]
    assert [(a.hook, a.name, a.args) for a in shape.head_actions] == [("OnNodeConfigured", "head-node.sh", ("ec2-user", "ec2-user"))]
    assert shape.shared == {"fsx-data": "/fsx/data", "fsx-checkpoints": "/fsx/checkpoints", "fsx-logs": "/fsx/logs"}
    assert shape.user == "ec2-user"
    assert set(a.url for a in (*queue.actions, *shape.head_actions)) <= set(shape.scripts)


def test_dynamic_nodes_get_their_own_names_and_a_moved_script_follows_the_config():
    raw = yaml.safe_load(FLAGSHIP.read_text())
    queue = raw["aws"]["queues"][0]
    del queue["capacity_reservation_id"]
    queue.update(max_count=4, min_count=1)
    raw["plan"]["cluster_nodes"] = raw["cluster"]["nodes"] = 4
    raw["models"] = raw["models"][:1]
    project = validate_project(raw)
    config = build_cluster_config(project)
    q = config["Scheduling"]["SlurmQueues"][0]
    q["CustomActions"] = {"OnNodeStart": q["CustomActions"]["OnNodeConfigured"]}
    shape = cluster_shape(project, config)
    assert shape.queues[0].nodes == ["gpu-queue-st-p5e-48xlarge-1", "gpu-queue-dy-p5e-48xlarge-1",
                                     "gpu-queue-dy-p5e-48xlarge-2", "gpu-queue-dy-p5e-48xlarge-3"]
    assert [a.hook for a in shape.queues[0].actions] == ["OnNodeStart"]


def test_a_script_clustertrain_did_not_generate_is_refused():
    project = load_project(FLAGSHIP)
    config = build_cluster_config(project)
    config["HeadNode"]["CustomActions"]["OnNodeStart"] = {"Script": "s3://elsewhere/mine.sh"}
    with pytest.raises(LaunchError, match="mine.sh is not a script clustertrain generates"):
        cluster_shape(project, config)


def test_with_nodes_resizes_the_job_queue_and_the_plan_together():
    project = with_nodes(load_project(FLAGSHIP), 40)
    assert project.aws.queues[0].max_count == 40 and project.plan.cluster_nodes == 40
    assert cluster_shape(project).node_count == 40


def test_gpu_type_is_the_lowercase_model_name():
    assert gpu_type("H200 141GB") == "h200" and gpu_type("A100 40GB") == "a100" and gpu_type(None) == "gpu"
