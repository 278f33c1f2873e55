"""The storage-side fault drills of issue 18, each against real processes. In every one nothing is lost beyond
the last complete checkpoint, ``latest`` always names a complete checkpoint, and each failure is one line naming
what failed and the fix.

1. The newest checkpoint damaged after its commit (one rank's shard overwritten): every gloo rank falls back to
   the previous one together (:meth:`CheckpointManager.load_latest`). Truncated and removed files, a garbled
   meta.json, sizes in meta.json: tests/unit/train/test_checkpoint_damage.py.
2. The file system of RUN_DIR/checkpoints fills up during a save (a tmpfs mounted over it in a private mount
   namespace): sync and async saves.
3. The S3 endpoint disappearing during a checkpoint backup and `clustertrain storage sync`:
   tests/integration/storage/test_storage_endpoint_drill.py (it needs that directory's moto fixtures).
4. The dataset's .bin truncated under a running job.
5. SIGKILL of the whole Slurm job (local cluster, 2 emulated nodes) while an async checkpoint is being written.

Drill 1's ranks run this file as a script (``python test_fault_drills_storage.py OUT PHASE ROOT``, see
:func:`rank_main`); each rank writes what it found to ``OUT/rank<R>.json``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from tests.support.training import clustertrain, metrics, run_cli, wait_for  # noqa: E402

pytestmark = pytest.mark.slow


# -- drill 1: the newest checkpoint damaged, across ranks -----------------------------------------------
def rank_main(out: Path, phase: str, root: Path) -> None:
    """``save``: FSDP over every rank, save steps 1 and 2 (rank 0 keeps step 1's full state in ref.pt);
    ``resume``: a fresh model, :meth:`load_latest`, report what was loaded and how it differs from ref.pt."""
    import datetime

    import torch
    import torch.distributed as dist

    from clustertrain.train.checkpoint_state import TrainState, app_state
    from tests.integration.train.test_checkpoint_ranks import build, differences, full_state, manager, train

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    model, opt = build("fsdp", seed=1 if phase == "save" else 2)
    mgr = manager(root, "fsdp")
    report: dict = {}
    if phase == "save":
        for step in (1, 2):
            train(model, opt, 1, seed=10 * step + rank)
            mgr.save(step, 16 * step, app_state(model, opt, TrainState(step, 16 * step)))
            ref = full_state(model, opt) if step == 1 else None  # collective: every rank gathers
            if rank == 0 and ref is not None:
                torch.save(ref, root / "ref.pt")
    else:
        ts = TrainState()
        loaded = mgr.load_latest(app_state(model, opt, ts))
        after = full_state(model, opt)
        report = {"path": str(loaded.path), "notes": loaded.notes, "train": ts.state_dict(),
                  "diff": differences(torch.load(root / "ref.pt"), after) if rank == 0 else []}
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


def run_ranks(world: int, out: Path, phase: str, root: Path, timeout: float = 120) -> list[dict]:
    """Run :func:`rank_main` on ``world`` gloo ranks; their reports, by rank."""
    from clustertrain.launch.local_ranks import free_port

    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world), OMP_NUM_THREADS="1",
               PYTHONWARNINGS="ignore", PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen([sys.executable, __file__, str(out), phase, str(root)], env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
             for r in range(world)]
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    assert [p.returncode for p in procs] == [0] * world, "\n".join(o[-2000:] for o in outputs)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def test_damaged_newest_checkpoint_falls_back_on_every_rank(tmp_path):
    root = tmp_path / "ckpt"
    run_ranks(2, tmp_path / "save", "save", root)
    shard = root / "step_00000002" / "__1_0.distcp"  # rank 1's shard: only rank 1's read fails
    shard.write_bytes(bytes(255 - b for b in shard.read_bytes()))  # same size: only DCP's load can tell
    reports = run_ranks(2, tmp_path / "resume", "resume", root)
    for rep in reports:  # DCP gathers rank 1's failure: both ranks fall back, together
        assert rep["path"] == str(root / "step_00000001") and rep["train"] == {"step": 1, "consumed_samples": 16}
    [note] = reports[0]["notes"]
    assert note.startswith(f"skipped checkpoint {root / 'step_00000002'} (DCP cannot load it: ") and "\n" not in note
    assert note.endswith("resuming from step_00000001 instead; set aside as damaged-step_00000002")
    assert reports[0]["diff"] == []  # every parameter and moment as saved at step 1
    assert (root / "latest").read_text() == "step_00000001\n" and (root / "damaged-step_00000002").is_dir()


# -- drill 2: the checkpoint file system fills up during a save ---------------------------------------------
def run_on_tmpfs(project: Path, run_dir: Path, size: str, *overrides: str) -> tuple[subprocess.CompletedProcess, Path]:
    """`clustertrain run` with RUN_DIR/checkpoints on a tmpfs of ``size`` (a private mount namespace); returns the
    result and a copy of the tmpfs as the run left it (the mount ends with the namespace)."""
    ckpts, snapshot = run_dir / "checkpoints", run_dir.parent / f"{run_dir.name}-checkpoints-at-exit"
    ckpts.mkdir(parents=True)
    snapshot.mkdir()
    script = ('size="$1" dir="$2" copy="$3"; shift 4; mount -t tmpfs -o size="$size" tmpfs "$dir" || exit 99; '
              '"$@"; rc=$?; cp -a "$dir/." "$copy" && exit $rc')
    cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", size, str(ckpts), str(snapshot), "--",
           sys.executable, "-m", "clustertrain", "run", str(project), "--run-dir", str(run_dir)]
    for item in overrides:
        cmd += ["--set", item]
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=180)
    assert res.returncode != 99, f"cannot mount a tmpfs here (needs root): {res.stdout}"
    return res, snapshot


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_disk_full_during_a_save_stops_the_run_in_one_line_and_latest_stays(tiny_project, tmp_path, mode):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs in a private mount namespace needs root")
    run_dir = tmp_path / "run"
    # one checkpoint is ~1.9 MB: the first (step 2) fits in 2.7 MiB, the second (step 4) does not
    res, left = run_on_tmpfs(tiny_project(steps=6, ckpt=2), run_dir, "2800k",
                             f"models.0.training.async_checkpoint={'true' if mode == 'async' else 'false'}")
    assert res.returncode == 2 and "Traceback" not in res.stdout, res.stdout
    [line] = [ln for ln in res.stdout.splitlines() if ln.startswith("error: ")]
    mount = run_dir / "checkpoints"
    assert line.startswith(f"error: tiny: checkpoint step 4 was not saved in {mount}: the file system is full "
                           f"(No space left on device): tmpfs mounted at {mount}, ") and " free of 2.7 MiB; " in line
    assert "latest still names step_00000002; free space there or move the run to a larger file system" in line
    assert sorted(p.name for p in left.iterdir()) == ["latest", "step_00000002"]  # no .tmp-step_00000004 left
    assert (left / "latest").read_text() == "step_00000002\n" and (left / "step_00000002" / "meta.json").is_file()
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "FAILED" and status["message"] == line.removeprefix("error: tiny: ")


# -- drill 4: the dataset truncated under a running job ------------------------------------------------------
def test_dataset_truncated_mid_run_is_one_line_and_the_rerun_resumes(tiny_project, tmp_path):
    project = tiny_project(steps=400, ckpt=5)
    run_dir = tmp_path / "run"
    proc = clustertrain("run", str(project), "--run-dir", str(run_dir))
    try:
        wait_for(lambda: (run_dir / "checkpoints" / "latest").is_file(), 120)  # a checkpoint to come back to
        dataset = json.loads((run_dir / "run.json").read_text())["dataset"]
        size = os.path.getsize(f"{dataset}.bin")
        os.truncate(f"{dataset}.bin", 4096)  # the ranks hold it open; a memory map would SIGBUS past 4 KiB
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 2 and "Traceback" not in out and "SIGBUS" not in out, out
    [line] = [ln for ln in out.splitlines() if ln.startswith("error: ")]
    assert line.startswith(f"error: tiny: {dataset}.bin: 4096 bytes now, {size} when training opened it ")
    assert "truncated or overwritten under the running job" in line and "resume from the last checkpoint" in line
    saved = int((run_dir / "checkpoints" / "latest").read_text().strip().removeprefix("step_"))
    stopped = max(r["step"] for r in metrics(run_dir))
    assert saved >= 5 and stopped < 400

    res = run_cli("run", str(project), "--run-dir", str(run_dir), "--set", f"models.0.training.max_steps={stopped + 2}")
    assert res.returncode == 0, res.stdout  # `run` re-tokenized the dataset (its size no longer matched)
    assert f"resumed from {run_dir / 'checkpoints' / f'step_{saved:08d}'} (step {saved})" in res.stdout
    assert [r["step"] for r in metrics(run_dir)] == list(range(1, stopped + 3))
    assert os.path.getsize(f"{dataset}.bin") == size


# -- drill 5: SIGKILL of the whole Slurm job while an async checkpoint is written --------------------------
BIG = """
name: drill5
cluster: {{backend: slurm, nodes: 2, gpus_per_node: 0, procs_per_node: 1, threads_per_worker: 1}}
storage: {{root: {root}}}
models:
  - name: big
    model: {{layers: 2, hidden: 64, heads: 4, seq_len: 32, ffn_hidden: 32768}}
    training: {{max_steps: 12, micro_batch: 1, global_batch: 2, lr: 1.0e-3, checkpoint_every: 4, keep_last: 2,
               log_every: 1, seed: 7}}
"""
# ffn_hidden 32768: ~8.5 M parameters, a 100 MB checkpoint whose async write (fsynced) takes 0.4-2 s here, while a
# step of 64 tokens takes ~0.4 s: a window wide enough to kill the job inside, without a test-only writer.


@pytest.fixture
def slurm_cluster(tmp_path_factory):
    from tests.support.slurm import local_slurm_cluster

    yield from local_slurm_cluster(tmp_path_factory.mktemp("slurm"), nodes=2)


def test_sigkill_of_the_slurm_job_during_an_async_save_resumes_from_the_last_complete_one(slurm_cluster, tmp_path):
    from clustertrain.launch.config import LaunchConfig
    from clustertrain.launch.slurm import SlurmLauncher, submit_project
    from clustertrain.resolve import load_project
    from tests.support.faults import sigkill_slurm_job

    path = tmp_path / "p.yaml"
    path.write_text(BIG.format(root=json.dumps(str(tmp_path / "fsx"))))
    project = load_project(path)
    slurm = SlurmLauncher(env=slurm_cluster.env(), launch=LaunchConfig(exclusive=False))  # 2 "nodes" share 2 CPUs
    [first] = submit_project(project, None, None, resume=True, launcher=slurm)
    ckpts = first.run_dir / "checkpoints"
    in_flight = ckpts / ".tmp-step_00000008"

    def writing_step_8() -> bool:  # step 4 is committed (a save commits the previous one first), 8 is being written
        return (ckpts / "latest").is_file() and in_flight.is_dir()

    wait_for(writing_step_8, 120, interval=0.005)
    assert sigkill_slurm_job(first.job_id)
    ended = slurm.wait(first.job_id, timeout=60)
    assert ended.state != "COMPLETED", ended
    assert in_flight.is_dir() and not (ckpts / "step_00000008").exists(), sorted(p.name for p in ckpts.iterdir())
    assert (ckpts / "latest").read_text() == "step_00000004\n"
    before = {r["step"]: r["loss"] for r in metrics(first.run_dir)}
    assert max(before) >= 8

    [again] = submit_project(project, None, None, resume=True, launcher=slurm)
    done = slurm.wait(again.job_id, timeout=120)
    log = "\n".join(slurm.logs(again.job_id))
    assert done.state == "COMPLETED", (done, log[-3000:])
    assert f"resumed from {ckpts / 'step_00000004'} (step 4)" in log
    assert not [p.name for p in ckpts.iterdir() if p.name.startswith(".tmp-")]  # the killed save was cleaned up
    assert (ckpts / "latest").read_text() == "step_00000012\n"
    rows = metrics(first.run_dir)
    assert [r["step"] for r in rows] == list(range(1, 13))  # steps 5.. re-trained once each, none skipped
    retrained = [r for r in rows if 5 <= r["step"] <= max(before)]
    assert [r["loss"] for r in retrained] == [before[r["step"]] for r in retrained]  # the same curve, continued


if __name__ == "__main__":
    rank_main(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]))
