"""CheckpointManager in one process: DCP round trip of model, optimizer, train state and RNG; the async
commit rule; format, architecture and shape refusals. (Multi-rank resharding and SIGKILL during an async
save: tests/integration/train/test_checkpoint_ranks.py.)"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint import FileSystemWriter

from clustertrain.core.errors import RunDirError
from clustertrain.core.checkpoint_format import check_ownership, complete_checkpoints, find_latest, read_meta
from clustertrain.train.checkpoint import CheckpointManager
from clustertrain.train.checkpoint_state import TrainState, app_state
from tests.support.training import wait_for

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # DCP warns that it runs without a process group
LAYOUT = {"world": 1, "dp": 1, "tp": 1, "zero_stage": 0}


def model_and_optim(seed: int = 0, out: int = 8):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Embedding(30, 16), torch.nn.Linear(16, out))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.arange(6)).square().sum().backward()
    opt.step()
    opt.zero_grad()
    return model, opt


def manager(root: Path, **kw) -> CheckpointManager:
    args = dict(keep_last=3, fingerprint="f", project="p", model_name="m", rank=0, world_size=1, layout=LAYOUT)
    return CheckpointManager(root, **{**args, **kw})


def snapshot(model, opt) -> dict:
    state = {f"p.{k}": v.clone() for k, v in model.state_dict().items()}
    for i, st in opt.state_dict()["state"].items():
        state.update({f"o.{i}.{k}": v.clone() for k, v in st.items()})
    return state


def equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


class Gate:
    """A gate between this process and the checkpoint writer process: open while its file exists."""

    def __init__(self, path: Path):
        self.path = path

    def set(self) -> None:
        self.path.touch()

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self.path.exists():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True


class GateWriter(FileSystemWriter):
    """Holds its data write until its gate is set: an async save that stays in flight on demand. Pickled to the
    writer process (async saves), so the gate is a file."""

    def __init__(self, path, gate: Gate):
        super().__init__(path)
        self.gate = gate

    def write_data(self, plan, planner):
        assert self.gate.wait(30)
        return super().write_data(plan, planner)


def test_sync_round_trip_restores_everything_and_records_the_layout(tmp_path):
    model, opt = model_and_optim(0)
    mgr = manager(tmp_path)
    path = mgr.save(3, 48, app_state(model, opt, TrainState(3, 48)))
    assert path == tmp_path / "step_00000003" == find_latest(tmp_path)
    assert (tmp_path / "latest").read_text() == "step_00000003\n"
    assert sorted(p.name for p in path.iterdir()) == [".metadata", "__0_0.distcp", "meta.json"]  # no side files
    meta = json.loads((path / "meta.json").read_text())
    assert (meta["version"], meta["layout"], meta["world_size"], meta["consumed_samples"]) == (3, LAYOUT, 1, 48)
    want, next_rand = snapshot(model, opt), torch.rand(4)

    other, other_opt = model_and_optim(1)
    assert not equal(snapshot(other, other_opt), want)
    train = TrainState()
    assert mgr.load(path, app_state(other, other_opt, train)).step == 3
    assert equal(snapshot(other, other_opt), want)
    assert train.state_dict() == {"step": 3, "consumed_samples": 48}
    assert torch.equal(torch.rand(4), next_rand)  # same layout: this rank's RNG stream continues


def test_another_layout_loads_without_the_rng_streams(tmp_path):
    model, opt = model_and_optim(0)
    path = manager(tmp_path).save(1, 16, app_state(model, opt, TrainState(1, 16)))
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    other, other_opt = model_and_optim(1)
    torch.manual_seed(123)
    moved = manager(tmp_path, layout={**LAYOUT, "zero_stage": 3})
    assert not moved.same_layout(read_meta(path))
    moved.load(path, app_state(other, other_opt, TrainState()))  # rng entry given, but not restored
    assert torch.equal(torch.rand(4), expected)
    assert equal(snapshot(other, other_opt), snapshot(model, opt))


def test_async_save_commits_only_once_written_and_holds_the_values_at_save_time(tmp_path):
    model, opt = model_and_optim(0)
    gate = Gate(tmp_path.parent / f"{tmp_path.name}.gate")
    mgr = manager(tmp_path, writer=lambda p: GateWriter(str(p), gate))
    gate.set()
    first = mgr.save(1, 16, app_state(model, opt, TrainState(1, 16)))
    gate.clear()
    assert mgr.save(2, 32, app_state(model, opt, TrainState(2, 32)), async_save=True) is None
    want = snapshot(model, opt)
    model[1].weight.data.add_(1.0)  # training goes on while the save is in flight
    assert mgr.poll() is None
    assert find_latest(tmp_path) == first and (tmp_path / ".tmp-step_00000002").is_dir()
    gate.set()
    assert mgr.wait() == tmp_path / "step_00000002" == find_latest(tmp_path)
    assert mgr.poll() is None and mgr.wait() is None  # nothing in flight any more
    mgr.close()

    other, other_opt = model_and_optim(1)
    mgr.load(tmp_path / "step_00000002", app_state(other, other_opt, TrainState()))
    assert equal(snapshot(other, other_opt), want)


def test_next_save_waits_for_the_previous_one(tmp_path):
    model, opt = model_and_optim(0)
    gate = Gate(tmp_path.parent / f"{tmp_path.name}.gate")
    mgr = manager(tmp_path, writer=lambda p: GateWriter(str(p), gate))
    mgr.save(1, 16, app_state(model, opt, TrainState(1, 16)), async_save=True)
    timer = threading.Timer(0.3, gate.set)
    timer.start()
    assert mgr.save(2, 32, app_state(model, opt, TrainState(2, 32))) == tmp_path / "step_00000002"
    timer.join()
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step_00000001", "step_00000002"]
    assert find_latest(tmp_path) == tmp_path / "step_00000002"
    gate.clear()
    mgr.save(3, 48, app_state(model, opt, TrainState(3, 48)), async_save=True)
    threading.Timer(0.3, gate.set).start()
    # an async save while one is in flight: waits for it and hands back its committed path
    assert mgr.save(4, 64, app_state(model, opt, TrainState(4, 64)), async_save=True) == tmp_path / "step_00000003"
    done = wait_for(mgr.poll, timeout=30)  # non-blocking: None until the write is done, then the committed path
    assert done == tmp_path / "step_00000004" == find_latest(tmp_path)
    mgr.close()


def test_keep_last_prunes_all_but_protected(tmp_path):
    model, opt = model_and_optim(0)
    from contextlib import contextmanager

    @contextmanager
    def protected():
        yield {"step_00000001"}

    mgr = manager(tmp_path, keep_last=2, protected=protected)
    for step in (1, 2, 3, 4):
        mgr.save(step, step * 16, app_state(model, opt, TrainState(step, step * 16)), async_save=step % 2 == 0)
    mgr.wait()
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step_00000001", "step_00000003", "step_00000004"]


def test_format_1_checkpoint_is_one_line_and_nothing_is_written(tmp_path):
    ckpt = tmp_path / "step_00000010"
    ckpt.mkdir()
    (ckpt / ".metadata").write_bytes(b"x")
    (ckpt / "rank_0.pt").write_bytes(b"x")
    (ckpt / "meta.json").write_text(json.dumps({"format": "clustertrain-checkpoint", "version": 1, "clustertrain": "0.1.0",
                                                "step": 10, "fingerprint": "f", "project": "p", "model": "m"}))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    want = (r"step_00000010: written by clustertrain 0\.1\.0 with the fused-qkv model \(checkpoint format 1\); "
            r"this version cannot load it — use --no-resume to archive it or another --run-dir")
    with pytest.raises(RunDirError, match=want):
        check_ownership(tmp_path, "f", "p", "m")
    model, opt = model_and_optim(0)
    with pytest.raises(RunDirError, match=want) as err:
        manager(tmp_path).load(ckpt, app_state(model, opt, TrainState()))
    assert "\n" not in str(err.value)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_another_architecture_or_shape_is_one_line_naming_the_checkpoint(tmp_path):
    model, opt = model_and_optim(0)
    path = manager(tmp_path).save(1, 16, app_state(model, opt, TrainState(1, 16)))
    wider, wider_opt = model_and_optim(0, out=9)
    with pytest.raises(RunDirError, match=r"step_00000001: holds model 'm' of project 'p', another architecture"):
        manager(tmp_path, fingerprint="g").load(path, app_state(wider, wider_opt, TrainState()))
    with pytest.raises(RunDirError, match=r"step_00000001: cannot be loaded into this model \(Size mismatch .*"
                       r"model_optim\.model\.1\.weight\); ") as err:
        manager(tmp_path).load(path, app_state(wider, wider_opt, TrainState()))
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_a_format_2_checkpoint_still_loads(tmp_path):
    """Format 2 kept AdamW's hyper-parameters per parameter group (``flatten=False``); format 3 keeps them per
    parameter. A checkpoint written the old way, meta.json version 2, loads every parameter and moment exactly."""
    from clustertrain.train.checkpoint_state import ModelOptimState

    model, opt = model_and_optim(0)
    state = app_state(model, opt, TrainState(3, 48))
    state["model_optim"] = ModelOptimState(model, opt, flatten=False)
    path = manager(tmp_path).save(3, 48, state)
    meta = json.loads((path / "meta.json").read_text())
    (path / "meta.json").write_text(json.dumps({**meta, "version": 2}))
    want = snapshot(model, opt)

    fresh, fresh_opt = model_and_optim(1)
    assert not equal(snapshot(fresh, fresh_opt), want)
    loaded = manager(tmp_path).load_latest(app_state(fresh, fresh_opt, TrainState()))
    assert loaded is not None and loaded.meta.version == 2
    assert equal(snapshot(fresh, fresh_opt), want)
    assert fresh_opt.param_groups[0]["betas"] == opt.param_groups[0]["betas"]
