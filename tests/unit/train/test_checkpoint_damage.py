"""Checkpoints damaged after their commit, and saves that fail, in one process (fault drills 1 and 2 of issue 18;
the same across real gloo ranks and a full file system: tests/integration/train/test_fault_drills_storage.py).

Drill 1: ``latest`` names a checkpoint whose files were damaged afterwards; :meth:`CheckpointManager.load_latest`
resumes from the previous complete one, says so in one line and sets the damaged one aside. Drill 2 here: a
write that fails with ENOSPC (a writer raising it) in the sync and async paths."""

from __future__ import annotations

import errno
import json
import re
import shutil

import pytest
from torch.distributed.checkpoint import FileSystemWriter

from clustertrain.core.errors import RunDirError
from clustertrain.core.checkpoint_format import check_ownership, damage, find_latest, read_meta
from clustertrain.train.checkpoint_state import TrainState, app_state
from tests.support.training import wait_for
from tests.unit.train.test_checkpoint_manager import equal, manager, model_and_optim, snapshot

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # DCP warns that it runs without a process group


def two_checkpoints(root):
    """Steps 1 and 2 saved from different values; returns the snapshot of step 1's values."""
    model, opt = model_and_optim(0)
    mgr = manager(root)
    mgr.save(1, 16, app_state(model, opt, TrainState(1, 16)))
    want = snapshot(model, opt)
    model[1].weight.data.add_(1.0)
    mgr.save(2, 32, app_state(model, opt, TrainState(2, 32)))
    return want


def load_latest(root):
    model, opt = model_and_optim(5)
    train = TrainState()
    loaded = manager(root).load_latest(app_state(model, opt, train))
    return loaded, snapshot(model, opt), train


def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def garble(path):
    path.write_bytes(bytes(255 - b for b in path.read_bytes()))  # same size, every byte changed


def drop_metadata(path):
    path.unlink()


@pytest.mark.parametrize("name, spoil, why", [
    ("__0_0.distcp", truncate, r"__0_0\.distcp is \d+ bytes, \d+ when it was saved"),
    ("__0_0.distcp", garble, r"DCP cannot load it: "),
    (".metadata", drop_metadata, r"\.metadata is missing"),
    ("meta.json", garble, r"meta\.json is damaged"),
], ids=["distcp-truncated", "distcp-overwritten", "metadata-removed", "meta-json-garbled"])
def test_damaged_latest_falls_back_to_the_previous_checkpoint_in_one_line(tmp_path, name, spoil, why):
    want = two_checkpoints(tmp_path)
    spoil(tmp_path / "step_00000002" / name)
    check_ownership(tmp_path, "f", "p", "m")  # judged on a checkpoint it can read: no refusal

    loaded, got, train = load_latest(tmp_path)
    assert loaded.path == tmp_path / "step_00000001" and loaded.meta.step == 1
    assert equal(got, want) and train.state_dict() == {"step": 1, "consumed_samples": 16}
    [note] = loaded.notes
    assert "\n" not in note
    assert note.startswith(f"skipped checkpoint {tmp_path / 'step_00000002'} (")
    assert re.search(why, note), note
    assert note.endswith("resuming from step_00000001 instead; set aside as damaged-step_00000002")
    # the damaged one no longer counts as a checkpoint (nor for keep_last); `latest` names the one loaded
    assert (tmp_path / "latest").read_text() == "step_00000001\n" and find_latest(tmp_path) == loaded.path
    assert sorted(p.name for p in tmp_path.iterdir()) == ["damaged-step_00000002", "latest", "step_00000001"]
    again, _, _ = load_latest(tmp_path)
    assert again.path == loaded.path and again.notes == []


def test_sizes_are_recorded_at_commit_and_old_meta_without_them_still_loads(tmp_path):
    want = two_checkpoints(tmp_path)
    newest = tmp_path / "step_00000002"
    files = read_meta(newest).files
    assert files == {p.name: p.stat().st_size for p in newest.iterdir() if p.name != "meta.json"}
    assert set(files) == {".metadata", "__0_0.distcp"} and damage(newest) is None

    meta = json.loads((newest / "meta.json").read_text())
    del meta["files"]  # as written before sizes were recorded
    (newest / "meta.json").write_text(json.dumps(meta))
    assert read_meta(newest).files is None and damage(newest) is None
    loaded, got, _ = load_latest(tmp_path)
    assert loaded.path == newest and loaded.notes == [] and not equal(got, want)


def test_every_checkpoint_damaged_is_one_line_naming_each(tmp_path):
    two_checkpoints(tmp_path)
    for step in (1, 2):
        truncate(tmp_path / f"step_0000000{step}" / "__0_0.distcp")
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(RunDirError) as err:
        load_latest(tmp_path)
    text = str(err.value)
    assert "\n" not in text and text.startswith(f"{tmp_path}: no checkpoint can be loaded (step_00000002: __0_0.distcp")
    assert "; step_00000001: __0_0.distcp is" in text and "--no-resume" in text and "storage restore" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing moved when nothing loaded


def test_latest_naming_a_removed_checkpoint_or_garbage(tmp_path):
    two_checkpoints(tmp_path)
    shutil.rmtree(tmp_path / "step_00000002")
    loaded, _, _ = load_latest(tmp_path)
    assert loaded.path == tmp_path / "step_00000001"
    assert loaded.notes == [f"skipped checkpoint {tmp_path / 'step_00000002'} (it does not exist): resuming from "
                            "step_00000001 instead"]
    (tmp_path / "latest").write_bytes(b"\xff\xfe garbage")
    assert find_latest(tmp_path) == tmp_path / "step_00000001"
    again, _, _ = load_latest(tmp_path)
    assert again.path == tmp_path / "step_00000001" and again.notes == []


def test_no_checkpoint_is_none(tmp_path):
    assert load_latest(tmp_path)[0] is None


class FullDisk(FileSystemWriter):
    """A writer whose data write fails as a full file system does (after writing a partial file)."""

    def write_data(self, plan, planner):
        (self.fs.concat_path(self.path, "__0_0.distcp")).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device", "__0_0.distcp")


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_a_save_that_does_not_fit_is_one_line_and_leaves_latest_alone(tmp_path, async_save):
    model, opt = model_and_optim(0)
    mgr = manager(tmp_path)
    mgr.save(1, 16, app_state(model, opt, TrainState(1, 16)))
    mgr.writer = lambda p: FullDisk(str(p))
    with pytest.raises(RunDirError) as err:
        mgr.save(2, 32, app_state(model, opt, TrainState(2, 32)), async_save=async_save)
        wait_for(mgr.poll, timeout=30)  # the async failure surfaces here
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith(f"checkpoint step 2 was not saved in {tmp_path}: the file system is full "
                           "(No space left on device): ")
    assert " mounted at /" in text and " free of " in text and "latest still names step_00000001" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_00000001"]  # .tmp-step_00000002 removed
    assert find_latest(tmp_path) == tmp_path / "step_00000001"


def test_another_write_error_names_it(tmp_path):
    class Denied(FileSystemWriter):
        def write_data(self, plan, planner):
            raise PermissionError(errno.EACCES, "Permission denied", str(self.path))

    model, opt = model_and_optim(0)
    with pytest.raises(RunDirError, match=r"checkpoint step 1 was not saved in .*: the write failed \(\[Errno 13\] "
                       r"Permission denied: .*\) on \S+ mounted at .*; no earlier checkpoint exists; free space"):
        manager(tmp_path, writer=lambda p: Denied(str(p))).save(1, 16, app_state(model, opt, TrainState(1, 16)))
    assert list(tmp_path.iterdir()) == []
