"""One writer per run directory on the real local Slurm: a second `submit` of a model whose job is still queued is
refused in one line naming that job and writes nothing; ranks that srun starts for another job refuse the run
directory too (before their first write); once the job has ended, the next `submit` is accepted and resumes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from clustertrain.core.job_records import read_records
from clustertrain.core.run_lease import read_lease
from clustertrain.core.run_paths import RunPaths
from clustertrain.launch.slurm import SlurmLauncher
from clustertrain.resolve import load_project
from tests.support.slurm import client_env, sbatch
from tests.support.training import metrics

pytestmark = pytest.mark.slow


def cli(cluster, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clustertrain", *args], capture_output=True, text=True,
                          env=client_env(cluster), timeout=timeout)


def listing(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_second_submit_of_a_queued_job_is_refused_and_a_later_one_resumes(local_slurm, slurm_project, tmp_path):
    path = slurm_project(steps=4, ckpt=2)
    run = load_project(path).storage.root / "sl" / "tiny"
    slurm = SlurmLauncher(env=local_slurm.env())
    blocker = sbatch(local_slurm, tmp_path, "sleep 300\n", "--nodes=2", "--exclusive", "-J", "blocker")
    try:
        first = cli(local_slurm, "submit", str(path))
        assert first.returncode == 0, first.stderr
        job = first.stdout.split("job ")[1].split()[0]
        assert read_lease(RunPaths(run)).job == job and slurm.status(job).state == "PENDING"

        before = listing(run)
        second = cli(local_slurm, "submit", str(path))
        assert second.returncode == 2 and second.stdout == ""
        assert second.stderr.count("error:") == 1 and "Traceback" not in second.stderr
        assert f"in use by Slurm job {job}; " in second.stderr and f"scancel {job}" in second.stderr
        assert listing(run) == before and [r.job_id for r in read_records(RunPaths(run))] == [job]

        # ranks of another job (srun's variables, the cluster's SLURM_CONF): rank 0 refuses before its first write
        rank_env = {k: v for k, v in client_env(local_slurm).items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        rank_env.update(SLURM_PROCID="0", SLURM_NTASKS="1", SLURM_LOCALID="0", SLURM_JOB_ID="99999",
                        SLURM_JOB_NODELIST="localhost")
        rank = subprocess.run([sys.executable, "-m", "clustertrain", "train", "--run-dir", str(run), "--model", "tiny"],
                              capture_output=True, text=True, env=rank_env, timeout=120)
        assert rank.returncode == 2, rank.stdout + rank.stderr
        assert f"in use by Slurm job {job}" in rank.stderr and "refused by Slurm job 99999" in rank.stderr
        assert "Traceback" not in rank.stderr and listing(run) == before
    finally:
        subprocess.run(["scancel", blocker], env=client_env(local_slurm), check=True)
    assert slurm.wait(job, timeout=120).state == "COMPLETED"

    resumed = cli(local_slurm, "submit", str(path), "--set", "models.tiny.training.max_steps=6")
    assert resumed.returncode == 0, resumed.stderr
    again = resumed.stdout.split("job ")[1].split()[0]
    assert read_lease(RunPaths(run)).job == again != job
    assert slurm.wait(again, timeout=120).state == "COMPLETED"
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4, 5, 6]  # steps 5 and 6 from the checkpoint at 4
    assert os.path.isdir(run / "checkpoints" / "step_00000006")
