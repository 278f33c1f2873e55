"""A new concern is one callback (:mod:`clustertrain.train.callbacks`), not a trainer edit: a recording callback
handed to the real :class:`~clustertrain.train.trainer.Trainer` (one CPU process, a prepared run directory, the
bundled corpus) sees every moment of the loop in order — each step's parts, every step's end, each logged row
(with the fields the trainer's own Watch callback added before it), each committed checkpoint and the end."""

from __future__ import annotations

import pytest
import torch

from clustertrain.core.ranks import RankInfo
from clustertrain.core.states import State
from clustertrain.launch.prepare import prepare_run
from clustertrain.resolve import load_project
from clustertrain.train.callbacks import Callback
from clustertrain.train.signals import StopRequest
from clustertrain.train.trainer import Trainer

pytestmark = pytest.mark.slow


class Recorder(Callback):
    def __init__(self):
        self.seen: list[tuple] = []

    def step_started(self, step):
        self.seen.append(("start", step))

    def phase(self, name, step=None):
        self.seen.append(("phase", name, step))

    def step_done(self, step, seconds, interval_mean_s):
        assert seconds > 0 and interval_mean_s > 0
        self.seen.append(("step", step))

    def logged(self, row, timings):
        self.seen.append(("logged", row["step"], "loss" in row, len(timings)))

    def committed(self, step, path, save_s, stopping, stop_received):
        self.seen.append(("committed", step, path.name, stopping))

    def finished(self, state, step):
        self.seen.append(("finished", state, step))

    def close(self):
        self.seen.append(("close",))


def test_a_recording_callback_sees_the_loop(tiny_project, tmp_path):
    project = load_project(tiny_project(steps=4, ckpt=2))
    entry = project.models[0]
    spec = prepare_run(project, entry, tmp_path / "run")
    recorder = Recorder()
    torch.set_num_threads(1)
    trainer = Trainer(project, entry, spec.paths, RankInfo.from_environ({}), torch.device("cpu"), extra=[recorder])
    outcome = trainer.fit(StopRequest())
    assert outcome.state == State.COMPLETED and outcome.step == 4
    seen = recorder.seen
    assert [s for s in seen if s[0] == "step"] == [("step", n) for n in (1, 2, 3, 4)]
    assert [s for s in seen if s[0] == "logged"] == [("logged", n, True, 1) for n in (1, 2, 3, 4)]
    assert [s[1:] for s in seen if s[0] == "committed"] == [(2, "step_00000002", False), (4, "step_00000004", False)]
    assert seen[-2:] == [("finished", State.COMPLETED, 4), ("close",)]
    # one step's parts, in order: the step's start, then data, forward, backward per micro-batch (accumulation 4:
    # global 16 / micro 4 on one rank), the norm and the optimizer
    assert [s for s in seen if s[0] == "start"] == [("start", n) for n in (1, 2, 3, 4)]
    first = [s for s in seen[:seen.index(("step", 1))] if s[0] == "phase"]
    names = [s[1] for s in first]
    assert seen[:2] == [("phase", "data", 1), ("start", 1)]  # the heartbeat names step 1 before anything acts in it
    assert first[0] == ("phase", "data", 1)
    assert names[1:] == ["data", "forward", "backward"] * 4 + ["optimizer", "optimizer"]
