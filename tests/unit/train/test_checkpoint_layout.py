"""Which directories count as checkpoints, and what `latest` resolves to (no processes needed)."""

import json

import pytest

from clustertrain.core.errors import RunDirError
from clustertrain.core.checkpoint_format import check_ownership, complete_checkpoints, find_latest
from clustertrain.train.checkpoint import clean_stale
from clustertrain.train.metrics import peak_flops_for


def make_ckpt(root, step, complete=True, fingerprint="abc"):
    d = root / f"step_{step:08d}"
    d.mkdir(parents=True)
    if complete:
        (d / ".metadata").write_bytes(b"x")
        (d / "meta.json").write_text(json.dumps({"version": 2, "step": step, "fingerprint": fingerprint,
                                                        "project": "p", "model": "m"}))
    return d


def test_latest_pointer_wins_when_complete(tmp_path):
    a, b = make_ckpt(tmp_path, 10), make_ckpt(tmp_path, 20)
    (tmp_path / "latest").write_text("step_00000010\n")
    assert find_latest(tmp_path) == a
    (tmp_path / "latest").write_text("step_00000020\n")
    assert find_latest(tmp_path) == b


def test_incomplete_dirs_never_count(tmp_path):
    good = make_ckpt(tmp_path, 10)
    make_ckpt(tmp_path, 20, complete=False)
    (tmp_path / "step_00000030").mkdir()
    (tmp_path / "step_00000030" / "meta.json").write_text("{}")  # DCP metadata missing
    (tmp_path / ".tmp-step_00000040").mkdir()
    (tmp_path / "latest").write_text("step_00000020\n")  # points at an incomplete one: fall back
    assert complete_checkpoints(tmp_path) == [good]
    assert find_latest(tmp_path) == good
    clean_stale(tmp_path)
    assert not (tmp_path / ".tmp-step_00000040").exists()
    assert find_latest(tmp_path / "nothing") is None


def test_ownership_refuses_another_architecture(tmp_path):
    make_ckpt(tmp_path, 10, fingerprint="abc")
    check_ownership(tmp_path, "abc", "p", "m")
    with pytest.raises(RunDirError, match="holds checkpoints of project 'p' model 'm'.*--no-resume"):
        check_ownership(tmp_path, "zzz", "q", "m")


def test_peak_flops_known_for_datacenter_gpus_only():
    assert peak_flops_for("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops_for("NVIDIA A100-SXM4-40GB") == 312e12
    assert peak_flops_for(None) is None and peak_flops_for("Some CPU") is None
