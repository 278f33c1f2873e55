"""bench/restart_stats.py's :class:`FileOps` counts a checkpoint's damage scan (``inspect``) on a real directory: one
``open`` of ``meta.json``, one ``scandir``, a ``stat`` for the directory and one per file the scan sizes (through
``os.DirEntry.stat``, which no audit event or ``os.stat`` wrapper sees), and nothing outside its root or after it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from clustertrain.core.checkpoint_format import CheckpointMeta, inspect
from clustertrain.core.run_records import write_record

ROOT = Path(__file__).resolve().parents[2]


def load_bench():
    spec = importlib.util.spec_from_file_location("restart_stats", ROOT / "bench" / "restart_stats.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_damage_scan_is_counted_per_file(tmp_path):
    ckpt, elsewhere = tmp_path / "checkpoints" / "step_00000001", tmp_path / "elsewhere"
    ckpt.mkdir(parents=True)
    elsewhere.mkdir()
    names = [".metadata", *(f"__{r}_0.distcp" for r in range(5))]
    for name in names:
        (ckpt / name).write_bytes(b"x" * 7)
    write_record(ckpt / "meta.json", CheckpointMeta(step=1, files=dict.fromkeys(names, 7)))
    ops = load_bench().FileOps(tmp_path / "checkpoints")
    with ops:
        assert inspect(ckpt) == (inspect(ckpt)[0], None)
        (elsewhere / "f").write_text("not counted")
        assert (elsewhere / "f").is_file()
    after = ops.reset()
    assert after == {"open": 2, "listdir": 0, "scandir": 2, "stat": 2 * (1 + len(names) + 1), "data": 0}, after
    with ops:
        (ckpt / "__0_0.distcp").read_bytes()
    assert ops.reset()["data"] == 1
    inspect(ckpt)  # outside the `with`: nothing counted
    assert ops.reset() == {"open": 0, "listdir": 0, "scandir": 0, "stat": 0, "data": 0}
