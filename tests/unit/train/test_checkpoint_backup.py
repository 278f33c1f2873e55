"""Background checkpoint backup: one upload in flight, the newest waiting one wins, keep_last never
deletes what is being copied, failures are recorded and never raised into training, and the real
uploader child process copies and verifies (to a local store here; S3 in tests/integration/storage)."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from clustertrain.storage import open_store, read_manifest
from clustertrain.train.checkpoint_backup import CheckpointBackup, child_upload, is_due
from clustertrain.core.checkpoint_format import complete_checkpoints, step_dir_name
from clustertrain.train.checkpoint import CheckpointManager


def fake_checkpoint(root: Path, step: int, size: int = 1000) -> Path:
    d = root / step_dir_name(step)
    d.mkdir(parents=True)
    (d / ".metadata").write_bytes(b"m")
    (d / "__0_0.distcp").write_bytes(bytes(range(256)) * (size // 256 + 1))
    (d / "meta.json").write_text(json.dumps({"step": step}))
    (root / "latest").write_text(d.name + "\n")
    return d


class GatedUpload:
    """A real upload (copytree) that waits for the test to open its gate: controls when a copy ends."""

    def __init__(self, dest: Path, fail: set[str] = frozenset()):
        self.dest, self.fail = dest, fail
        self.started: list[str] = []
        self.gates: dict[str, threading.Event] = {}
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()

    def gate(self, name: str) -> threading.Event:
        return self.gates.setdefault(name, threading.Event())

    def __call__(self, ckpt: Path, url: str) -> None:
        with self.lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.started.append(ckpt.name)
        try:
            assert self.gate(ckpt.name).wait(10)
            assert ckpt.is_dir(), f"{ckpt} was deleted while being uploaded"
            if ckpt.name in self.fail:
                raise RuntimeError(f"connection reset while copying {ckpt.name}")
            shutil.copytree(ckpt, self.dest / ckpt.name)
        finally:
            with self.lock:
                self.in_flight -= 1


def wait(cond, timeout=10.0):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "condition not met"
        time.sleep(0.01)


def test_one_in_flight_newest_waiting_wins_and_close_waits_for_the_last(tmp_path):
    root = tmp_path / "checkpoints"
    up = GatedUpload(tmp_path / "bucket")
    logs: list[str] = []
    b = CheckpointBackup(lambda c: f"s3://b/{c.name}", up, logs.append)
    c1, c2, c3 = (fake_checkpoint(root, s) for s in (5, 10, 15))
    b.submit(c1)
    wait(lambda: up.started == ["step_00000005"])
    b.submit(c2)
    b.submit(c3)  # c2 never started: superseded by c3
    assert b.busy()
    up.gate(c1.name).set()
    wait(lambda: up.started == ["step_00000005", "step_00000015"])
    up.gate(c3.name).set()
    records = b.close(timeout=10)
    assert [(r.checkpoint, r.state) for r in records] == [
        ("step_00000010", "superseded"), ("step_00000005", "verified"), ("step_00000015", "verified")]
    assert up.max_in_flight == 1
    assert sorted(p.name for p in (tmp_path / "bucket").iterdir()) == ["step_00000005", "step_00000015"]
    assert any("step_00000010 skipped: superseded by step_00000015" in line for line in logs)
    fields = b.status_fields(c3)
    assert fields["backup"] == "s3://b/step_00000015" and fields["backup_state"] == "verified"
    assert fields["backup_error"] is None and records[1].started <= records[1].finished


def test_failed_upload_is_recorded_not_raised(tmp_path):
    root = tmp_path / "checkpoints"
    up = GatedUpload(tmp_path / "bucket", fail={"step_00000005"})
    logs: list[str] = []
    b = CheckpointBackup(lambda c: f"s3://b/{c.name}", up, logs.append)
    c1 = fake_checkpoint(root, 5)
    up.gate(c1.name).set()
    b.submit(c1)
    records = b.close(timeout=10)
    assert [(r.state, r.error) for r in records] == [("failed", "connection reset while copying step_00000005")]
    assert any("FAILED: connection reset" in line and "training goes on" in line for line in logs)
    fields = b.status_fields(c1)
    assert fields["backup"] is None and fields["backup_state"] == "failed"
    assert fields["backup_error"] == "connection reset while copying step_00000005"


def test_keep_last_never_deletes_a_checkpoint_being_uploaded_or_waiting(tmp_path):
    root = tmp_path / "checkpoints"
    up = GatedUpload(tmp_path / "bucket")
    b = CheckpointBackup(lambda c: f"s3://b/{c.name}", up, lambda _m: None)
    mgr = CheckpointManager(root, keep_last=1, fingerprint="f", project="p", model_name="m", rank=0, world_size=1,
                            protected=b.protected)
    c1 = fake_checkpoint(root, 5)
    b.submit(c1)
    wait(lambda: up.started == [c1.name])
    c2 = fake_checkpoint(root, 10)
    b.submit(c2)  # waiting behind c1
    fake_checkpoint(root, 15)
    mgr.prune()  # keep_last=1 would leave only step 15
    assert [p.name for p in complete_checkpoints(root)] == ["step_00000005", "step_00000010", "step_00000015"]
    up.gate(c1.name).set()
    up.gate(c2.name).set()
    b.close(timeout=10)
    assert (tmp_path / "bucket" / c1.name / "__0_0.distcp").read_bytes() == (c1 / "__0_0.distcp").read_bytes()
    mgr.prune()  # the final prune once nothing is in flight
    assert [p.name for p in complete_checkpoints(root)] == ["step_00000015"]
    assert not list(root.glob(".trash-*"))


def test_unprotected_prune_is_unchanged(tmp_path):
    root = tmp_path / "checkpoints"
    for s in (1, 2, 3, 4):
        fake_checkpoint(root, s)
    CheckpointManager(root, keep_last=2, fingerprint="f", project="p", model_name="m", rank=0, world_size=1).prune()
    assert [p.name for p in complete_checkpoints(root)] == ["step_00000003", "step_00000004"]


def test_due_every_nth_periodic_checkpoint_by_step():
    entry = SimpleNamespace(training=SimpleNamespace(checkpoint_every=100, backup_every=3))
    assert [s for s in range(100, 1001, 100) if is_due(entry, s)] == [300, 600, 900]
    assert not is_due(SimpleNamespace(training=SimpleNamespace(checkpoint_every=100)), 300)  # field absent: only the last


def test_real_child_process_copies_and_verifies(tmp_path):
    ckpt = fake_checkpoint(tmp_path / "checkpoints", 7, size=300_000)
    dest = tmp_path / "store" / ckpt.name
    child_upload(None, None)(ckpt, str(dest))
    assert (dest / "__0_0.distcp").read_bytes() == (ckpt / "__0_0.distcp").read_bytes()
    assert set(read_manifest(open_store(dest)).by_path()) >= {"meta.json", ".metadata", "__0_0.distcp"}


def test_child_process_failure_becomes_one_line(tmp_path):
    ckpt = fake_checkpoint(tmp_path / "checkpoints", 7)
    with pytest.raises(Exception) as err:
        child_upload(None, None)(ckpt, "gopher://nowhere/x")
    assert "unknown storage URL scheme" in str(err.value) and "\n" not in str(err.value)
