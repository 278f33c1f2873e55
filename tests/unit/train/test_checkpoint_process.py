"""Async saves in the checkpoint writer process (one per rank, stopped by ``close``), overlapped staging, and old
checkpoints deleted off the commit (issue 38 item 5). Across real ranks, SIGKILL of a rank and its writer:
tests/integration/train/test_checkpoint_ranks.py."""

from __future__ import annotations

import os
import time

import pytest

from clustertrain.core.checkpoint_format import complete_checkpoints, find_latest
from clustertrain.train.checkpoint import clean_stale
from clustertrain.train.checkpoint_state import TrainState, app_state
from tests.unit.train.test_checkpoint_manager import equal, manager, model_and_optim, snapshot

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # DCP warns that it runs without a process group


def alive(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_async_saves_run_in_a_child_writer_process_that_close_stops(tmp_path):
    model, opt = model_and_optim(0)
    mgr = manager(tmp_path)
    mgr.prepare_async()
    mgr.save(1, 16, app_state(model, opt, TrainState(1, 16)), async_save=True)
    pid = mgr._async.writer_pid
    assert pid is not None and pid != os.getpid() and alive(pid)
    assert int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1]) == os.getpid()  # our child
    assert mgr.save(2, 32, app_state(model, opt, TrainState(2, 32)), async_save=True) == tmp_path / "step_00000001"
    assert mgr._async.writer_pid == pid  # one writer for the run, not one per save
    assert mgr.close() == tmp_path / "step_00000002" == find_latest(tmp_path)
    assert not alive(pid)


def test_overlapped_staging_saves_the_values_of_the_save_call(tmp_path):
    model, opt = model_and_optim(0)
    mgr = manager(tmp_path, overlap_staging=True)
    want = snapshot(model, opt)
    assert mgr.save(1, 16, app_state(model, opt, TrainState(1, 16)), async_save=True) is None
    mgr.staged()  # what the trainer does before the optimizer step
    for p in model.parameters():
        p.data.add_(1.0)  # the optimizer step changes the parameters in place
    for st in opt.state.values():
        st["exp_avg"].add_(1.0)
    assert mgr.close() == tmp_path / "step_00000001"
    fresh, fresh_opt = model_and_optim(3)
    mgr.load(tmp_path / "step_00000001", app_state(fresh, fresh_opt, TrainState()))
    assert equal(snapshot(fresh, fresh_opt), want) and not equal(snapshot(model, opt), want)


def test_old_checkpoints_are_deleted_after_the_commit_returns(tmp_path):
    """keep_last=1: the commit renames the old checkpoint out of the way (it counts no more at once) and returns;
    a background thread deletes it (many files: still there when save returns); close waits for it."""
    model, opt = model_and_optim(0)
    mgr = manager(tmp_path, keep_last=1)
    first = mgr.save(1, 16, app_state(model, opt, TrainState(1, 16)))
    for i in range(4000):  # a checkpoint of many files, as at 640 ranks
        (first / f"__{i}_0.distcp").write_bytes(b"")
    t0 = time.perf_counter()
    assert mgr.save(2, 32, app_state(model, opt, TrainState(2, 32))) == tmp_path / "step_00000002"
    returned = time.perf_counter() - t0
    trash = [p.name for p in tmp_path.iterdir() if p.name.startswith(".trash-step_00000001-")]
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step_00000002"]
    assert len(trash) == 1, sorted(p.name for p in tmp_path.iterdir())  # renamed, deletion still under way
    mgr.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_00000002"], returned


def test_a_kill_mid_delete_leaves_what_clean_stale_removes(tmp_path):
    model, opt = model_and_optim(0)
    mgr = manager(tmp_path)
    mgr.save(1, 16, app_state(model, opt, TrainState(1, 16)))
    half = tmp_path / ".trash-step_00000000-1795000000000000000"  # a delete a kill interrupted
    half.mkdir()
    (half / "meta.json").write_text("{}")
    (half / ".metadata").write_bytes(b"x")
    assert find_latest(tmp_path) == tmp_path / "step_00000001"
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step_00000001"]
    clean_stale(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_00000001"]


def test_the_writer_outlives_the_stop_signals_slurm_sends_to_every_process_of_the_step(tmp_path):
    """The batch script's USR2 (and scancel's TERM) reach every process of the step; the writer must live on to write
    the rank's stop checkpoint (it died with code -12 on the local Slurm before it ignored them)."""
    import signal

    import multiprocessing

    from clustertrain.train.checkpoint_async import WRITER_NAME

    model, opt = model_and_optim(0)
    mgr = manager(tmp_path)
    mgr.prepare_async()
    # while it starts too (spawned, importing torch): the signals wait blocked until it ignores them
    starting = []
    for _ in range(200):
        starting = [c for c in multiprocessing.active_children() if c.name == WRITER_NAME]
        if starting:
            break
        time.sleep(0.01)
    for sig in (signal.SIGUSR2, signal.SIGTERM):
        os.kill(starting[0].pid, sig)
    mgr.save(1, 16, app_state(model, opt, TrainState(1, 16)), async_save=True)
    pid = mgr._async.writer_pid
    assert pid == starting[0].pid
    for sig in (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        os.kill(pid, sig)
    time.sleep(0.5)
    assert alive(pid)
    mgr.save(2, 32, app_state(model, opt, TrainState(2, 32)), async_save=True)
    assert mgr.close() == tmp_path / "step_00000002" and not alive(pid)
