"""launch_findings (the launch part of `clustertrain check`) and the checks `submit` itself refuses on:
the ranks' interpreter, node counts vs the queue, time limit vs step + checkpoint vs the stop signal."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from clustertrain.core.errors import LaunchError
from clustertrain.launch.config import LaunchConfig
from clustertrain.launch.preflight import launch_findings, save_seconds
from clustertrain.launch.slurm import SlurmLauncher, submit_project
from clustertrain.resolve import load_project

ROOT = Path(__file__).resolve().parents[3]
P5E = ROOT / "examples" / "p5e-80x7.yaml"
#: the flagship with models that fit the built-in trainer (1.3B), so only the launch rules speak
FITS = [f"models.{i}.model.{k}={v}" for i in range(7) for k, v in (("layers", 24), ("hidden", 2048), ("heads", 16))]
FITS += ["image=null"]  # the example runs in its built image; these tests start from the host interpreter


def paths(findings, level="error"):
    return [f.path for f in findings if f.level == level]


def test_the_submitters_private_python_is_refused_on_a_cluster():
    project = load_project(P5E, FITS)
    [f] = [f for f in launch_findings(project) if f.path == "launch.python"]
    assert f.level == "error" and sys.executable in f.message and "sys.executable" in f.message
    assert "/fsx/data, /fsx/checkpoints, /fsx/logs" in f.message and "cluster.container_image" in f.fix
    shared = load_project(P5E, [*FITS, "launch.python=/fsx/data/envs/train/bin/python"])
    assert "launch.python" not in paths(launch_findings(shared))
    relative = load_project(P5E, [*FITS, "launch.python=python3"])
    assert "not an absolute path" in next(f.message for f in launch_findings(relative) if f.path == "launch.python")


def test_a_container_image_file_must_be_shared_a_registry_image_need_not():
    image = load_project(P5E, [*FITS, "cluster.container_image=/home/me/train.sqsh"])
    [f] = [f for f in launch_findings(image) if f.path == "cluster.container_image"]
    assert f.level == "error" and "/home/me/train.sqsh" in f.message
    assert "launch.python" not in paths(launch_findings(image))  # the image's python runs
    shared = load_project(P5E, [*FITS, "cluster.container_image=/fsx/data/images/train.sqsh"])
    registry = load_project(P5E, [*FITS, "cluster.container_image=nvcr.io#nvidia/pytorch:26.02-py3"])
    assert paths(launch_findings(shared)) == paths(launch_findings(registry)) == []


def test_no_aws_section_no_mount_rule_and_local_backend_nothing():
    local = load_project(ROOT / "examples" / "quickstart.yaml")
    assert launch_findings(local) == []


def test_node_counts_must_fit_the_queue():
    project = load_project(P5E, [*FITS, "aws.queues.0.max_count=12", "plan.cluster_nodes=12",
                                 "launch.python=/fsx/data/venv/bin/python",
                                 "launch.max_segments=100"])  # 12 nodes for 7 models: weeks (clustertrain.launch.segments)
    found = [f for f in launch_findings(project) if f.level == "error"]
    assert [f.path for f in found] == []  # 12 nodes: each model alone fits ...
    project = load_project(P5E, [*FITS, "aws.queues.0.max_count=10", "launch.python=/fsx/data/venv/bin/python"])
    found = [f for f in launch_findings(project) if f.level == "error"]
    assert "plan.cluster_nodes" in [f.path for f in found]
    assert any("runs on 14 nodes, but aws.queues[0] (gpu-queue) launches at most 10" in f.message for f in found)


def test_time_limit_grace_step_and_checkpoint_rules():
    base = [*FITS, "launch.python=/fsx/data/venv/bin/python"]
    ok = load_project(P5E, [*base, 'cluster.time_limit="48:00:00"', "launch.signal_grace_s=600"])
    assert paths(launch_findings(ok)) == []
    save, how = save_seconds(ok, 1_280_000_000)
    assert save == pytest.approx(1.28e9 * 12 / 1e9) and "1 GB/s" in how
    short = load_project(P5E, [*base, 'cluster.time_limit="48:00:00"', "launch.signal_grace_s=10"])
    grace = [f for f in launch_findings(short) if f.path == "launch.signal_grace_s"]
    assert grace and "a checkpoint save" in grace[0].message and "at least" in grace[0].fix
    instant = load_project(P5E, [*base, 'cluster.time_limit="5:00"', "launch.signal_grace_s=300"])
    assert paths(launch_findings(instant)) == ["cluster.time_limit"]
    rare = load_project(P5E, [*base, 'cluster.time_limit="1:00:00"', *(f"models.{i}.training.checkpoint_every=100000"
                                                                         for i in range(7))])
    assert "models[0].training.checkpoint_every" in paths(launch_findings(rare), "warning")
    often = load_project(P5E, [*base, 'cluster.time_limit="48:00:00"', "models.0.training.checkpoint_every=1"])
    [f] = [f for f in launch_findings(often) if f.path == "models[0].training.checkpoint_every"]
    assert "of the time goes to saving" in f.message
    unlimited = load_project(P5E, [*base, "cluster.time_limit=null"])
    assert "cluster.time_limit" in paths(launch_findings(unlimited), "warning")


def test_discouraged_nccl_variables_in_launch_env_are_flagged():
    project = load_project(P5E, [*FITS, "launch.env.NCCL_TUNER_PLUGIN=/opt/x.so", "launch.env.NCCL_DEBUG=INFO"])
    warned = paths(launch_findings(project), "warning")
    assert "launch.env.NCCL_TUNER_PLUGIN" in warned and "launch.env.NCCL_DEBUG" not in warned


def test_submit_refuses_infeasible_models_one_line_each_before_writing_anything(tmp_path):
    ddp = [f"models.{i}.parallelism.zero_stage=0" for i in range(7)]  # replicated, the flagship's models do not fit
    project = load_project(P5E, ["launch.python=/fsx/data/venv/bin/python", f"storage.runs={tmp_path}/runs", *ddp])
    with pytest.raises(LaunchError) as err:
        submit_project(project, None, None, True, SlurmLauncher(), dry_run=True)
    lines = str(err.value).splitlines()
    assert lines[0] == "submit refused (7 problems):"
    assert [ln.split(":")[0].strip() for ln in lines[1:]] == [f"models[{i}].parallelism" for i in range(7)]
    assert "needs 172.4 GiB per GPU" in lines[1] and "needs 319.3 GiB per GPU" in lines[7]
    with pytest.raises(LaunchError, match=r"submit refused \(1 problem\):\n  models\[6\].parallelism: model-7"):
        submit_project(project, "model-7", None, True, SlurmLauncher())
    assert not (tmp_path / "runs").exists()
