"""The model-7 twin (``examples/model7-twin.yaml``) through ``clustertrain submit`` on the local Slurm cluster, as
the file describes its job: 2 nodes x 2 ranks (gloo), FSDP2 over the 4 ranks. Only the storage root and the
number of steps are overridden, and the job runs in a container image, as model-7 does: the local Slurm has no Pyxis,
so every rank (and the watchdog) runs in the stand-in view of clustertrain/launch/container_view.py — a read-only
root, only the mounts writable, HOME not mounted. The local-worker runs of the twin are
tests/integration/train/test_model7_twin.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from clustertrain.core.job_records import read_records
from clustertrain.launch.slurm import SlurmLauncher
from clustertrain.resolve import load_project
from clustertrain.core.run_paths import RunPaths
from clustertrain.core.checkpoint_format import read_meta
from tests.support.slurm import client_env
from tests.support.training import metrics

pytestmark = pytest.mark.slow
TWIN = Path(__file__).resolve().parents[3] / "examples" / "model7-twin.yaml"


def test_twin_trains_through_submit_on_two_nodes_of_two_ranks(local_slurm, tmp_path):
    image = tmp_path / "fsx" / "images" / "twin.sqsh"
    image.parent.mkdir(parents=True)
    image.write_text("stand-in: the local Slurm has no Pyxis; the ranks run in the container view\n")
    sets = [f"storage.root={json.dumps(str(tmp_path / 'fsx'))}", "models.0.training.max_steps=16",
            "models.0.training.checkpoint_every=8", "models.0.training.log_every=1",
            f"cluster.container_image={json.dumps(str(image))}"]
    argv = [sys.executable, "-m", "clustertrain", "submit", str(TWIN)]
    for item in sets:
        argv += ["--set", item]
    sub = subprocess.run(argv, capture_output=True, text=True, env=client_env(local_slurm), timeout=120)
    assert sub.returncode == 0, sub.stdout + sub.stderr
    run = load_project(TWIN, sets).storage.root / "model7-twin" / "model-7-twin"
    assert sub.stdout.startswith("submitted model-7-twin: job ") and f"(run dir {run}," in sub.stdout

    slurm = SlurmLauncher(env=local_slurm.env())
    job_id = slurm.attach(RunPaths(run))
    final = slurm.wait(job_id, timeout=240)
    log = "\n".join(slurm.logs(job_id))
    assert (final.state, final.exit_code, final.extra["nodes"], final.extra["restarts"]) == \
        ("COMPLETED", 0, ["node1", "node2"], 0), (final, log[-3000:])
    assert "4 rank(s) (fsdp 4, grads reduced once per step, params fp32 / compute fp32 / reduce fp32), grad accumulation 2" in log
    assert "training complete at step 16" in log
    [record] = read_records(RunPaths(run))
    script = Path(record.script).read_text()
    assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=2" in script  # 2 nodes x 2 ranks, as the file says
    # every rank and the watchdog in the view, given the options Pyxis would get; srun itself gets none of them
    [ranks] = [line for line in script.splitlines() if line.startswith("srun ")]
    assert ranks.index("container_view") < ranks.index(f"--container-image={image}") < ranks.index(" -- ") \
        < ranks.index("-m clustertrain train"), ranks
    assert "--no-container-mount-home" in ranks and "--container-mounts=" in ranks
    assert script.count("clustertrain.launch.container_view") == 2  # the ranks' step and the watchdog's
    assert (run / "cache").is_dir()  # HOME and the caches went to the mounted cache root, not the read-only image
    rows = metrics(run)
    assert [r["step"] for r in rows] == list(range(1, 17))
    assert rows[-1]["loss"] < rows[0]["loss"] - 1.0, (rows[0], rows[-1])
    latest = run / "checkpoints" / "step_00000016"
    assert (run / "checkpoints" / "latest").read_text().strip() == latest.name
    layout = read_meta(latest).layout
    assert (layout["world"], layout["dp"], layout["tp"], layout["zero_stage"], layout["reshard_after_forward"]) == \
        (4, 4, 1, 3, False)
    assert (run / "COMPLETED").is_file()
