"""`clustertrain rehearse` for real: Slurm (slurmd -N per node, fake GPU gres), one mount namespace per node, the
project's own node scripts in ParallelCluster's boot order, every model's real batch script, 8 ranks per node.

Doubles: the GPUs (character devices Slurm hands out; no CUDA behind them), Pyxis (the ranks run in the stand-in
view of clustertrain/launch/container_view.py, given Pyxis's own options), S3 for the node scripts (``aws s3 cp`` served from the rehearsal's copy of the upload), EFA devices.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from clustertrain.core.errors import LaunchError
from clustertrain.rehearsal.run import RehearseOptions, rehearse
from clustertrain.resolve import project_from_mapping
from clustertrain.resolve import load_project

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]
FLAGSHIP = ROOT / "examples" / "p5e-80x7.yaml"


@pytest.fixture(autouse=True)
def _root_and_slurm():
    if os.geteuid() != 0:
        pytest.skip("the rehearsal needs root (mount namespaces, slurmd as SlurmUser=root)")


def small_project(nodes: int = 5, pins: tuple[int, ...] = (2, 3), **storage: str):
    """The flagship, cut down: ``len(pins)`` models pinned to those node counts on a queue of ``nodes``."""
    raw = yaml.safe_load(FLAGSHIP.read_text())
    first = raw["models"][0]
    training = dict(first["training"], global_batch=48)  # a multiple of dp = 8, 16 and 24 ranks
    raw["models"] = [dict(first, name=f"model-{i + 1}", plan={"nodes": n}, training=training) for i, n in enumerate(pins)]
    raw["aws"]["queues"][0]["max_count"] = nodes
    raw["plan"]["cluster_nodes"] = nodes
    raw["cluster"]["nodes"] = min(nodes, raw["cluster"]["nodes"])
    raw["storage"].update(storage)
    return project_from_mapping(raw, source="small copy of p5e-80x7")


def surviving(rdir: Path) -> tuple[list[int], list[str]]:
    """Processes whose command line or Slurm config names ``rdir``, and mounts under it in ANY mount namespace."""
    import psutil

    text, procs, mounts = str(rdir), [], set()
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(text in a for a in p.info["cmdline"] or []) or p.environ().get("SLURM_CONF", "").startswith(text):
                procs.append(p.pid)
            with open(f"/proc/{p.pid}/mountinfo") as f:
                mounts |= {line.split()[4] for line in f if text in line}
        except (psutil.Error, OSError):
            continue
    return procs, sorted(mounts)


def check(report, name):
    return next(c for c in report.checks if c.name == name)


def test_flagship_rehearses_80_nodes_and_seven_concurrent_models(tmp_path):
    rdir = tmp_path / "r"
    report = rehearse(load_project(FLAGSHIP), RehearseOptions(dir=rdir))
    failed = {c.name: c.details for c in report.failed}
    assert report.ok, failed
    assert (report.nodes, report.gpus) == (80, 640)
    assert [(j["model"], j["planned_nodes"], len(j["nodes"]), j["state"]) for j in report.jobs] == \
        [(f"model-{i}", 11, 11, "RUNNING") for i in range(1, 7)] + [("model-7", 14, 14, "RUNNING")]
    assert surviving(rdir) == ([], [])


def test_storage_off_the_fsx_mounts_fails_the_shared_storage_check(tmp_path):
    rdir = tmp_path / "r"
    report = rehearse(small_project(runs="/data/runs"), RehearseOptions(dir=rdir))
    assert check(report, "booted").ok
    dirs, paths = check(report, "dirs"), check(report, "paths")
    assert dirs.ok is False and any("/data/runs/p5e-80x7/model-1" in d for d in dirs.details), dirs.details
    # the run directory is a --container-mounts source; on the nodes that did not create it (node-local /data)
    # the container cannot start, as Pyxis cannot bind a missing source: no rank ran, and the job's output says why
    world = check(report, "world")
    assert world.ok is False and any("0 rank records" in d for d in world.details), world.details
    log = next(rdir.rglob("p5e-80x7-model-1-*.out")).read_text()
    assert "container view: mount source /data/runs/p5e-80x7/model-1 does not exist on this node" in log, log[-2000:]
    assert surviving(rdir) == ([], [])


def test_compute_script_moved_to_on_node_start_fails_the_boot_and_names_it(tmp_path):
    def move(config: dict) -> dict:
        queue = config["Scheduling"]["SlurmQueues"][0]
        queue["CustomActions"] = {"OnNodeStart": queue["CustomActions"].pop("OnNodeConfigured")}
        return config

    rdir = tmp_path / "r"
    report = rehearse(small_project(nodes=3, pins=(1, 2)), RehearseOptions(dir=rdir, edit_config=move))
    booted = check(report, "booted")
    assert booted.ok is False
    text = " ".join(booted.details)
    assert "OnNodeStart" in text and "compute-node.sh" in text and "not mounted" in text, booted.details
    assert check(report, "concurrent").ok is None  # no job was submitted
    assert report.jobs == []
    assert surviving(rdir) == ([], [])


def test_oversubscribed_plan_reports_the_pending_model_and_slurms_reason(tmp_path):
    rdir = tmp_path / "r"
    report = rehearse(small_project(nodes=5, pins=(2, 2, 2)), RehearseOptions(dir=rdir, settle_s=2.0))
    concurrent = check(report, "concurrent")
    assert concurrent.ok is False
    assert any("model-3" in d and "Resources" in d for d in concurrent.details), concurrent.details
    states = {j["model"]: (j["state"], j["reason"]) for j in report.jobs}
    assert states["model-1"][0] == states["model-2"][0] == "RUNNING"
    assert states["model-3"] == ("PENDING", "Resources")
    assert surviving(rdir) == ([], [])


def test_script_without_gpu_directive_fails_the_gpu_check_and_a_leaked_key_fails_secrets(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-a-real-key-but-named-like-one")
    drop = lambda text: "\n".join(ln for ln in text.splitlines() if not ln.startswith("#SBATCH --gpus-per-node"))  # noqa: E731
    rdir = tmp_path / "r"
    report = rehearse(small_project(nodes=2, pins=(1, 1)), RehearseOptions(dir=rdir, edit_script=drop))
    one_gpu = check(report, "one_gpu")
    assert one_gpu.ok is False and any("CUDA_VISIBLE_DEVICES" in d for d in one_gpu.details), one_gpu.details
    secrets = check(report, "secrets")
    assert secrets.ok is False and any("AWS_SECRET_ACCESS_KEY" in d for d in secrets.details), secrets.details
    assert "not-a-real-key" not in str(report.as_dict())
    assert check(report, "rendezvous").ok and check(report, "world").ok
    assert surviving(rdir) == ([], [])


def test_caches_under_home_fail_in_the_containers_view_until_they_go_to_the_nodes_nvme(tmp_path):
    """Every rank runs in the stand-in for Pyxis (read-only image root, HOME not mounted). Without the batch
    script's HOME/XDG_CACHE_HOME/TRITON_CACHE_DIR (as before issue 37) a cache under HOME fails, named."""
    bare = lambda text: "\n".join(ln for ln in text.splitlines()  # noqa: E731
                                   if not ln.startswith(("export HOME=", "export XDG_CACHE_HOME=", "export TRITON_CACHE_DIR=")))
    report = rehearse(small_project(nodes=2, pins=(1, 1)), RehearseOptions(dir=tmp_path / "r", edit_script=bare))
    paths = check(report, "paths")
    assert paths.ok is False, paths.details
    assert any("cache directory /root/.cache: Read-only file system" in d and "point HOME" in d
               for d in paths.details), paths.details
    fixed = rehearse(small_project(nodes=2, pins=(1, 1)), RehearseOptions(dir=tmp_path / "r2"))
    assert fixed.ok, {c.name: c.details for c in fixed.failed}
    script = (tmp_path / "r2").rglob("*.sbatch")
    text = next(script).read_text()
    assert "export HOME=/scratch/containers-cache/" in text and "clustertrain.launch.container_view" in text
    assert surviving(tmp_path / "r") == ([], []) and surviving(tmp_path / "r2") == ([], [])


@pytest.mark.parametrize("project, args, expected", [
    (ROOT / "examples" / "quickstart.yaml", [], "cluster.backend is 'local'"),
    (FLAGSHIP, ["--nodes", "500"], "at most 200"),
    (FLAGSHIP, ["--set", "models.6.parallelism.zero_stage=0"], "the plan does not fit"),
    (FLAGSHIP, ["--set", "models.6.plan.nodes=81"], "more nodes than the cluster has"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, project, args, expected):
    rdir = tmp_path / "r"
    proc = subprocess.run([sys.executable, "-m", "clustertrain", "rehearse", str(project), "--dir", str(rdir), *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and expected in lines[0], proc.stderr
    assert not rdir.exists()
    assert surviving(rdir) == ([], [])


def test_a_used_rehearsal_directory_is_refused(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "records").mkdir()
    with pytest.raises(LaunchError, match="is not an empty directory"):
        rehearse(small_project(nodes=2, pins=(1, 1)), RehearseOptions(dir=tmp_path / "r"))
    assert [p.name for p in (tmp_path / "r").iterdir()] == ["records"]


def test_busy_rendezvous_port_is_refused_before_anything_starts(tmp_path):
    from clustertrain.core.ranks import port_for_job

    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # earlier rehearsals may leave it in TIME_WAIT
        taken.bind(("127.0.0.1", port_for_job(1)))
        taken.listen()
        with pytest.raises(LaunchError, match=f"port {port_for_job(1)}"):
            rehearse(small_project(nodes=2, pins=(1, 1)), RehearseOptions(dir=tmp_path / "r"))
    assert not (tmp_path / "r").exists()


def test_a_differently_shaped_project_two_queues_dynamic_nodes_ubuntu(tmp_path):
    """Not the flagship's shape: p4d (A100) nodes without a reservation (ParallelCluster's dynamic -dy- nodes), a
    second CPU queue, Ubuntu's default user, two models of 2 nodes on a queue of 4."""
    raw = yaml.safe_load(FLAGSHIP.read_text())
    first = raw["models"][0]
    # on an A100 40GB the flagship's layout does not fit (38.7 GiB without resharding, more with per-step gradients)
    layout = dict(first["parallelism"], reshard_after_forward=True, grad_sync="per_microbatch")
    raw["models"] = [dict(first, name=f"m{i}", plan={"nodes": 2}, parallelism=layout,
                          training=dict(first["training"], global_batch=32)) for i in (1, 2)]
    raw["cluster"].update(instance_type="p4d.24xlarge", partition="train", nodes=2)
    raw["plan"] = {"cluster_nodes": 4}
    raw["storage"]["region"] = raw["aws"]["region"] = "us-east-1"
    raw["aws"].update(os="ubuntu2204", availability_zone="us-east-1a", queues=[
        {"name": "train", "instance_type": "p4d.24xlarge", "max_count": 4, "capacity_type": "ONDEMAND"},
        {"name": "cpu", "instance_type": "c6i.4xlarge", "max_count": 2, "capacity_type": "ONDEMAND"}])
    rdir = tmp_path / "r"
    report = rehearse(project_from_mapping(raw, source="two queues"), RehearseOptions(dir=rdir, keep=False))
    assert report.ok, {c.name: c.details for c in report.failed}
    assert (report.nodes, report.gpus) == (6, 32)
    assert [(j["model"], len(j["nodes"]), j["state"]) for j in report.jobs] == [("m1", 2, "RUNNING"), ("m2", 2, "RUNNING")]
    assert all("-dy-" in n for j in report.jobs for n in j["nodes"])
    boots = {p.stem for p in (rdir / "boot").glob("*.json")} - {"spec"}
    assert boots == {"head", *(f"train-dy-p4d-24xlarge-{i}" for i in range(1, 5)), "cpu-dy-c6i-4xlarge-1",
                     "cpu-dy-c6i-4xlarge-2"}
    head_log = (rdir / "boot" / "head" / "OnNodeConfigured-head-node.sh.log").read_text()
    assert "owner ubuntu:ubuntu" in head_log  # setup-dirs.sh ran with Ubuntu's default user, which the node has
    assert surviving(rdir) == ([], [])


def test_cli_prints_json_and_exits_1_when_a_check_fails(tmp_path):
    """Seven models on a 2-node queue: they fit one by one, not together; the report says so, as JSON."""
    proc = subprocess.run([sys.executable, "-m", "clustertrain", "rehearse", str(FLAGSHIP), "--nodes", "2", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    report = __import__("json").loads(proc.stdout)
    assert (report["ok"], report["nodes"], report["gpus"]) == (False, 2, 16)
    failed = [c["name"] for c in report["checks"] if c["ok"] is False]
    assert failed == ["concurrent"], report["checks"]
    states = [j["state"] for j in report["jobs"]]
    assert states.count("RUNNING") == 1 and states.count("PENDING") == 6
