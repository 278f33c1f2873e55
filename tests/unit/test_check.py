"""`clustertrain check`: the preflight that joins the stages, on the flagship and on projects shaped
differently (other mount points, a root that is itself the mount, other node counts, ubuntu2204, a
Capacity Block, EBS only). The rules are the stages' own; these tests show they compose and that the
commands that act (`submit`, `cluster config`, `validate suite`) refuse on the same errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clustertrain.check import require_clean, run_check
from clustertrain.cli import main
from clustertrain.core.errors import ConfigError
from clustertrain.resolve import load_project

ROOT = Path(__file__).resolve().parents[2]
P5E = ROOT / "examples" / "p5e-80x7.yaml"
#: the flagship's models shrunk to 1.3B so the built-in trainer can train them: then only the cluster rules speak
#: (24 x 2048, 16 query and the preset's 8 key/value heads, SwiGLU 5632 = 8/3 x 2048 rounded up to 256: 1.26B)
FITS = [f"models.{i}.model.{k}={v}" for i in range(7)
        for k, v in (("layers", 24), ("hidden", 2048), ("heads", 16), ("ffn_hidden", 5632))]
#: the flagship's models replicated (DDP) instead of FSDP2: none fits an H200, so the plan section refuses them
DDP = [f"models.{i}.parallelism.zero_stage=0" for i in range(7)]



def tokenizer_at(path: str) -> list[str]:
    return [f"models.{i}.data.tokenizer={path}" for i in range(7)]


SHAPES = {
    "flagship-fits": [],
    "one-fsx-at-the-root": ["aws.fsx=[{name: shared, mount_dir: /lustre, capacity_gb: 2400, throughput: 250}]",
                            "storage.root=/lustre", "image.dir=/lustre/images",
                            *tokenizer_at("/lustre/tok/tokenizer.json")],
    "other-mounts-with-holds": ["aws.fsx=[{name: d, mount_dir: /mnt/data, capacity_gb: 1200, holds: [datasets]}, "
                                "{name: c, mount_dir: /mnt/ckpt, capacity_gb: 2400, holds: [checkpoints, logs, tensorboard, outputs]}]",
                                "image=null", "cluster.container_image=/mnt/data/img.sqsh", *tokenizer_at("/mnt/data/tok.json")],
    "ubuntu-40-nodes": ["aws.os=ubuntu2204", "plan.cluster_nodes=40", "aws.queues.0.max_count=40"],
    "capacity-block": ["aws.queues.0.capacity_type=CAPACITY_BLOCK"],
    "ebs-only": ["aws.fsx=[]", "aws.ebs=[{name: shared, mount_dir: /shared, size_gb: 2000}]",
                 "image.dir=/shared/images", *tokenizer_at("/shared/tok.json")],
}


def errors(report):
    return [f"{s}: {f.path}: {f.message}" for s, f in report.errors]


@pytest.mark.parametrize("shape", SHAPES)
def test_differently_shaped_projects_pass(shape):
    project = load_project(P5E, [*FITS, *SHAPES[shape]])
    report = run_check(project)
    assert report.sections == ["layout", "cluster", "plan", "framework", "data", "init_from", "image", "launch", "trackers", "secrets"]
    assert errors(report) == []
    # warnings say what could not be verified here, never nothing at all for a cluster project
    assert any(s == "data" for s, _ in report.warnings)


@pytest.mark.parametrize("shape,override,section,field", [
    ("flagship-fits", "storage.runs=/home/ec2-user/runs", "layout", "storage.runs"),
    ("flagship-fits", "storage.logs=/var/log/train", "layout", "storage.logs"),
    ("one-fsx-at-the-root", "storage.tensorboard=/tb", "layout", "storage.tensorboard"),
    ("ebs-only", "storage.datasets=/data", "layout", "storage.datasets"),
    ("ebs-only", "models.0.data.tokenizer=/fsx/data/tok.json", "data", None),
    ("other-mounts-with-holds", "cluster.container_image=/home/me/img.sqsh", "launch", "cluster.container_image"),
    ("ubuntu-40-nodes", "aws.queues.0.max_count=30", "launch", "plan.cluster_nodes"),
    ("capacity-block", "aws.queues.0.min_count=0", "cluster", None),
    ("ebs-only", "image=null", "launch", "launch.python"),
    ("one-fsx-at-the-root", "image.dir=/opt/images", "layout", "image.dir"),
])
def test_the_same_rules_refuse_each_shape(shape, override, section, field):
    project = load_project(P5E, [*FITS, *SHAPES[shape], override])
    report = run_check(project)
    found = [(s, f.path) for s, f in report.errors]
    assert found, f"{override} was not caught"
    assert section in [s for s, _ in found], found
    if field is not None:
        assert (section, field) in found, found


def test_the_flagship_passes_and_fails_only_on_the_plan_when_replicated():
    assert run_check(load_project(P5E)).errors == []
    report = run_check(load_project(P5E, DDP))
    assert {s for s, _ in report.errors} == {"plan"}
    assert [f.path for _, f in report.errors] == [f"models[{i}].parallelism" for i in range(7)]
    assert all("builtin" in f.message and "GiB per GPU" in f.message for _, f in report.errors)


def test_secrets_never_reach_a_generated_file():
    project = load_project(P5E, [*FITS, "launch.env.AWS_SECRET_ACCESS_KEY=abc", "launch.env.HF_HUB=AKIAABCDEFGHIJKLMNOP"])
    found = [f.path for s, f in run_check(project, only=["secrets"]).errors]
    assert found[:2] == ["launch.env.AWS_SECRET_ACCESS_KEY", "launch.env.HF_HUB"]
    assert any(p.startswith("batch script of") for p in found)  # and the rendered script holds it: also reported
    assert run_check(load_project(P5E, FITS), only=["secrets"]).errors == []


def test_each_action_refuses_on_its_gate():
    flagship = load_project(P5E, DDP)  # infeasible models: a cluster can still be built, a job cannot be submitted
    require_clean(flagship, "cluster config")
    with pytest.raises(ConfigError, match=r"^submit refused: models\[0\]\.parallelism: .*\(and 6 more\)"):
        require_clean(flagship, "submit")
    off = load_project(P5E, [*FITS, "storage.runs=/home/u/runs"])
    for action in ("cluster config", "validate suite", "submit"):
        with pytest.raises(ConfigError, match=f"^{action} refused: storage.runs: "):
            require_clean(off, action)


def test_submit_of_one_model_is_not_blocked_by_another():
    project = load_project(P5E, DDP[:6])  # models 1-6 replicated (infeasible), model-7 keeps FSDP2
    require_clean(project, "submit", ["model-7"])
    with pytest.raises(ConfigError, match=r"models\[0\]"):
        require_clean(project, "submit", ["model-1"])


def test_cli_one_line_per_finding_and_exit_codes(capsys, tmp_path):
    with pytest.raises(SystemExit) as done:
        main(["check", str(P5E), *(a for s in DDP for a in ("--set", s))])
    out = capsys.readouterr().out
    assert done.value.code == 2
    rows = [ln for ln in out.splitlines() if ln.startswith(("error", "warning"))]
    assert sum(ln.startswith("error") for ln in rows) == 7 and all("fix:" in ln for ln in rows)
    assert out.rstrip().endswith("(checked: layout, cluster, plan, framework, data, init_from, image, launch, trackers, secrets)")
    with pytest.raises(SystemExit) as done:
        main(["check", str(P5E), "--json", *(a for s in FITS for a in ("--set", s))])
    assert done.value.code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] and {f["level"] for f in data["findings"]} == {"warning"}
    with pytest.raises(SystemExit) as done:  # a ParallelCluster file is not a project: one line says what to run
        main(["check", str(ROOT / "examples" / "seed-003-cluster.yaml")])
    assert done.value.code == 2 and "clustertrain cluster validate" in capsys.readouterr().err


def test_cluster_config_writes_nothing_when_refused(tmp_path, capsys):
    out = tmp_path / "cluster.yaml"
    with pytest.raises(SystemExit) as done:
        main(["cluster", "config", str(P5E), "-o", str(out), "--set", "storage.logs=/var/log/x"])
    assert done.value.code == 2 and not out.exists()
    assert capsys.readouterr().err.count("\n") == 1
    with pytest.raises(SystemExit) as done:
        main(["cluster", "config", str(P5E), "-o", str(out)])
    assert done.value.code == 0 and out.exists()
