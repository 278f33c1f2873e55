"""The storage layout: every path a job uses is derived from where the project says each kind of data
lives, and a cluster project whose paths are off its shared mounts is refused naming the field.

Shapes tested (none special-cases the flagship): FSx mounts with `holds` below a root that is their
parent (the flagship), one FSx at a root that *is* the mount, EBS only, explicit storage.* fields,
no aws: section (local)."""

from __future__ import annotations

from pathlib import Path

import pytest

from clustertrain.cloud.scripts import model_dirs
from clustertrain.core.errors import ConfigError
from clustertrain.launch.prepare import default_run_dir
from clustertrain.launch.sbatch import build_request
from clustertrain.core.storage_layout import mount_of, off_mount_problems, project_dirs, storage_layout
from clustertrain.project import validate_project
from clustertrain.resolve import load_project

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

FSX3 = [
    {"name": "fsx-data", "mount_dir": "/fsx/data", "holds": ["datasets"]},
    {"name": "fsx-ckpt", "mount_dir": "/fsx/checkpoints", "holds": ["checkpoints", "outputs"]},
    {"name": "fsx-logs", "mount_dir": "/fsx/logs", "holds": ["logs", "tensorboard"]},
]


def project(storage: dict | None = None, fsx: list | None = None, ebs: list | None = None, aws: bool = True):
    raw = {
        "name": "proj",
        "cluster": {"backend": "slurm", "nodes": 2, "gpus_per_node": 8, "instance_type": "p5e.48xlarge",
                    "partition": "gpu"},
        "storage": storage or {"root": "/fsx"},
        "models": [{"name": "m1", "model": {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 64},
                    "training": {"max_steps": 10, "micro_batch": 1, "global_batch": 16}},
                   {"name": "m2", "model": {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 64},
                    "training": {"max_steps": 10, "micro_batch": 1, "global_batch": 16}}],
    }
    if aws:
        raw["aws"] = {"region": "us-east-1", "queues": [{"name": "gpu", "instance_type": "p5e.48xlarge", "max_count": 4}],
                      "fsx": FSX3 if fsx is None else fsx, "ebs": ebs or []}
    return validate_project(raw, source="test")


def test_flagship_shape_paths_follow_holds_not_the_root():
    p = project()  # storage.root /fsx is each node's root volume: only /fsx/<x> are mounts
    lay = storage_layout(p)
    assert lay.run_dir("m1") == Path("/fsx/checkpoints/proj/m1")
    assert lay.log_dir("m1") == Path("/fsx/logs/proj/logs/m1")
    assert lay.tensorboard_dir("m1") == Path("/fsx/logs/proj/tensorboard/m1")  # same file system, its own directory
    assert lay.datasets == Path("/fsx/data/datasets")
    assert lay.validation_dir() == Path("/fsx/checkpoints/proj/validation")
    assert off_mount_problems(p) == []
    # the stages use it: the run dir, the batch script's output, the container mounts
    assert default_run_dir(p, p.models[0]) == Path("/fsx/checkpoints/proj/m1")
    req = build_request(p, p.models[0], default_run_dir(p, p.models[0]))
    assert str(req.log_dir) == "/fsx/logs/proj/logs/m1"
    # every path a job writes is under a mount, none on the root volume /fsx itself
    for d in project_dirs(p):
        assert mount_of(d, lay.mounts) is not None, d


def test_unheld_kinds_go_to_the_first_file_system():
    p = project(fsx=[{"name": "a", "mount_dir": "/lustre", "holds": []}, {"name": "b", "mount_dir": "/lustre2", "holds": ["logs"]}])
    lay = storage_layout(p)
    assert lay.run_dir("m1") == Path("/lustre/proj/m1")
    assert lay.log_dir("m2") == Path("/lustre2/proj/logs/m2")
    assert lay.origin["checkpoints"] == "aws.fsx[0].mount_dir"
    assert lay.origin["logs"] == "aws.fsx[1].holds"


def test_ebs_only_cluster_uses_its_mount():
    p = project(fsx=[], ebs=[{"name": "shared", "mount_dir": "/shared"}])
    assert storage_layout(p).run_dir("m1") == Path("/shared/proj/m1")
    assert off_mount_problems(p) == []


def test_explicit_field_off_the_mounts_is_named():
    p = project(storage={"root": "/fsx", "runs": "/home/ec2-user/runs", "logs": "/fsx/logs/custom"})
    problems = off_mount_problems(p)
    assert [f for f, _ in problems] == ["storage.runs"]
    assert "/home/ec2-user/runs" in problems[0][1] and "/fsx/data" in problems[0][1]
    # the node scripts refuse to lay out such a project (nothing is written: the error comes first)
    with pytest.raises(ConfigError, match="storage.runs"):
        model_dirs(p)


def test_no_shared_file_system_is_one_problem():
    p = project(fsx=[])
    assert off_mount_problems(p) == [(
        "aws.fsx", off_mount_problems(p)[0][1])]
    assert "no shared file system" in off_mount_problems(p)[0][1]


def test_extra_paths_are_checked_too():
    p = project()
    problems = off_mount_problems(p, extra={"launch.python": "/home/me/.venv/bin/python", "cluster.container_image": "/fsx/data/img.sqsh"})
    assert [f for f, _ in problems] == ["launch.python"]


def test_local_project_keeps_root_layout(tmp_path):
    p = project(storage={"root": str(tmp_path)}, aws=False)
    lay = storage_layout(p)
    assert lay.run_dir("m1") == tmp_path / "proj" / "m1"
    assert lay.log_dir("m1") == tmp_path / "proj" / "logs" / "m1"
    assert lay.tensorboard_dir("m1") is None  # stays inside the run dir
    assert lay.datasets == tmp_path / "datasets"
    assert off_mount_problems(p) == []


def test_setup_dirs_create_exactly_what_jobs_use():
    p = project()
    dirs = model_dirs(p)
    lay = storage_layout(p)
    for m in ("m1", "m2"):
        assert str(lay.run_dir(m)) in dirs and str(lay.log_dir(m)) in dirs
    assert str(lay.datasets) in dirs
    assert not any(d.startswith("/fsx/m1") for d in dirs)  # the old per-model tree nothing used


def test_relative_storage_fields_resolve_against_the_project_file(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("name: p\nstorage: {root: r, logs: l}\nmodels:\n - name: m\n   model: {layers: 1, hidden: 8, heads: 1, seq_len: 8}\n"
                 "   training: {max_steps: 1, micro_batch: 1, global_batch: 2}\n")
    p = load_project(f)
    assert p.storage.root == tmp_path / "r" and p.storage.logs == tmp_path / "l"
    assert storage_layout(p).log_dir("m") == tmp_path / "l" / "p" / "logs" / "m"


def test_flagship_example_is_on_its_mounts_and_derives_its_buckets():
    p = load_project(EXAMPLES / "p5e-80x7.yaml")
    assert off_mount_problems(p) == []
    assert p.storage.checkpoint_bucket and p.storage.checkpoint_bucket.startswith(f"s3://{p.aws.buckets.checkpoints}/")
    assert p.storage.region == p.aws.region


@pytest.mark.parametrize("text,ok", [("48:00:00", True), ("2-00:00:00", True), ("30", True), ("1-12", True),
                                     ("90:00", True), ("48h", False), ("", False)])
def test_time_limit_strings(text, ok):
    raw = {"name": "p", "models": [{"name": "m", "model": {"layers": 1, "hidden": 8, "heads": 1, "seq_len": 8},
                                    "training": {"max_steps": 1, "micro_batch": 1, "global_batch": 2}}],
           "cluster": {"time_limit": text}}
    if ok:
        assert validate_project(raw).cluster.time_limit_seconds > 0
    else:
        with pytest.raises(ConfigError, match="time_limit"):
            validate_project(raw)


def test_unquoted_yaml_time_limit_is_one_clear_line(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("name: p\ncluster: {time_limit: 48:00:00}\nmodels:\n - name: m\n   model: {layers: 1, hidden: 8, heads: 1, seq_len: 8}\n"
                 "   training: {max_steps: 1, micro_batch: 1, global_batch: 2}\n")
    with pytest.raises(ConfigError) as err:
        load_project(f)
    msg = str(err.value)
    assert "cluster.time_limit" in msg and "quote" in msg and "\n" not in msg
    assert validate_project({"name": "p", "cluster": {"time_limit": "48:00:00"}, "models": [
        {"name": "m", "model": {"layers": 1, "hidden": 8, "heads": 1, "seq_len": 8},
         "training": {"max_steps": 1, "micro_batch": 1, "global_batch": 2}}]}).cluster.time_limit_seconds == 48 * 3600


def test_global_batch_is_checked_on_each_models_own_node_count():
    """A model pinned to 3 nodes is judged on dp = 3 x 8, not cluster.nodes; with plan.cluster_nodes the planner picks."""
    base = {"name": "p", "cluster": {"backend": "slurm", "nodes": 2, "gpus_per_node": 8},
            "models": [{"name": "m", "model": {"layers": 1, "hidden": 8, "heads": 1, "seq_len": 8},
                        "training": {"max_steps": 1, "micro_batch": 1, "global_batch": 48}, "plan": {"nodes": 3}}]}
    assert validate_project(base).dp_size(validate_project(base).models[0]) == 24  # 48 % 16 == 0 too, but 24 is used
    base["models"][0]["training"]["global_batch"] = 32  # divides dp 16 (cluster.nodes) but not dp 24 (pinned)
    with pytest.raises(ConfigError, match=r"micro_batch x dp \(1 x 24 = 24\)"):
        validate_project(base)
    base["plan"] = {"cluster_nodes": 5}  # shared cluster: the planner judges the pinned count (plan_findings)
    assert validate_project(base).models[0].training.global_batch == 32


def test_kinds_sharing_a_base_never_share_a_directory():
    """logs + tensorboard on one file system, outputs + checkpoints on another (the flagship's holds): every
    model's run, log and TensorBoard directory and the validation directory are distinct and not nested."""
    p = project()
    lay = storage_layout(p)
    dirs = [lay.validation_dir()] + [d for m in ("m1", "m2") for d in (lay.run_dir(m), lay.log_dir(m), lay.tensorboard_dir(m))]
    assert len(set(dirs)) == len(dirs)
    for a in dirs:
        for b in dirs:
            assert a == b or not a.is_relative_to(b), (a, b)
    for name in ("logs", "validation", "tensorboard"):
        with pytest.raises(ConfigError, match="reserved"):
            validate_project({"name": "p", "models": [{"name": name, "model": {"layers": 1, "hidden": 8, "heads": 1, "seq_len": 8},
                                                        "training": {"max_steps": 1, "micro_batch": 1, "global_batch": 2}}]})
