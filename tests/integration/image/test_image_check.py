"""`clustertrain image check` for real on the local Slurm cluster (emulated nodes on 127.0.0.1, slurm-wlm 22.05,
no Pyxis plugin, no GPU): in the image, srun refuses --container-image and the check says Pyxis is missing;
with --no-container the node's host is scanned and compared with the pins.

The .sqsh is a stand-in file (a few bytes): Enroot and Pyxis cannot exist here, and the first case never gets
past srun's own option parsing, which is the real thing under test."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

from clustertrain.image.check import ImageCheckReport
from clustertrain.image.paths import sqsh_path
from clustertrain.resolve import load_project
from tests.support.slurm import client_env, local_slurm_cluster

pytestmark = pytest.mark.slow

PROJECT = """
name: imgchk
cluster: {{backend: slurm, nodes: 1, gpus_per_node: 0, procs_per_node: 1}}
storage: {{root: {root}}}
launch: {{exclusive: false}}
image: {{dir: {images}}}
models:
  - name: tiny
    model: {{layers: 2, hidden: 64, heads: 4, seq_len: 64}}
    training: {{max_steps: 2, micro_batch: 4, global_batch: 8}}
"""


@pytest.fixture(scope="module")
def local_slurm(tmp_path_factory):
    yield from local_slurm_cluster(tmp_path_factory.mktemp("slurm"), nodes=1)


@pytest.fixture(scope="module")
def project_file(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("imgchk")
    path = tmp / "imgchk.yaml"
    path.write_text(PROJECT.format(root=json.dumps(str(tmp / "fsx")), images=json.dumps(str(tmp / "images"))))
    sqsh = sqsh_path(load_project(path))
    sqsh.parent.mkdir(parents=True)
    sqsh.write_bytes(b"hsqs")  # stand-in for the built image (see the module docstring)
    return path


def image_check(cluster, project: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clustertrain", "image", "check", str(project), "--timeout", "60", *args],
                          capture_output=True, text=True, env=client_env(cluster), timeout=120)


def test_in_the_image_without_pyxis_the_check_fails_naming_pyxis(local_slurm, project_file):
    proc = image_check(local_slurm, project_file)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "verdict: FAILED: Pyxis is not installed or enabled on this cluster" in proc.stdout
    assert "--no-container" in proc.stdout and "component" not in proc.stdout  # no rows: no table header
    [written] = list((project_file.parent / "fsx").rglob("image-check.json"))
    report = ImageCheckReport.model_validate_json(written.read_text())
    assert report.container and report.image == str(sqsh_path(load_project(project_file))) and report.rows == []
    # srun's own refusal is in the job's log, where the check read it
    [log] = list((written.parent / "logs").glob("imgchk-image-check-*.out"))
    assert "unrecognized option '--container-image=" in log.read_text()


def test_no_container_scans_the_node_s_host_and_compares_it_with_the_pins(local_slurm, project_file):
    proc = image_check(local_slurm, project_file, "--no-container", "--json")
    report = ImageCheckReport.model_validate_json(proc.stdout)
    assert proc.returncode == (1 if report.failed else 0), proc.stdout + proc.stderr
    assert not report.container and report.image is None and report.node in local_slurm.node_names
    rows = {r.component: r for r in report.rows}
    assert list(rows) == ["cuda", "nccl", "aws_ofi_nccl", "libfabric", "torch"]  # image.megatron is false
    # this host has no GPU: torch cannot read an NCCL version, the scan fails it, so does the check
    assert (rows["nccl"].found, rows["nccl"].verdict, rows["nccl"].pinned) == ("not found", "fail", "2.29")
    assert report.failed and report.state == "FAILED"  # the scan step exits 1 when a check fails
    torch = importlib.metadata.version("torch")
    assert rows["torch"].found == f"torch {torch}" and rows["torch"].version == torch
    assert rows["torch"].verdict == ("pass" if torch.startswith("2.11.") else "warn")  # pin 2.11.0a0
    assert json.loads(Path(report.directory, "image-check.json").read_text()) == json.loads(proc.stdout)
