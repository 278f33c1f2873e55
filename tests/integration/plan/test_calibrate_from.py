"""``clustertrain plan --calibrate-from RUN_DIR`` on the run directory of a real short run of the trainer (2 gloo ranks):
the pilot's measured step and rate become the plan's, another model is predicted by its FLOPs, and a run that cannot
calibrate the project is refused in one line (exit 2). A GPU pilot (recorded on an H200): tests/unit/plan/test_pilot.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from clustertrain.core.model_shape import ModelShape
from clustertrain.plan.pilot import plan_from_pilot, read_pilot
from clustertrain.resolve import load_project

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
P5E = ROOT / "examples" / "p5e-80x7.yaml"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clustertrain", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=240)


@pytest.fixture(scope="module")
def pilot_dir(tmp_path_factory) -> Path:
    """A real pilot: the quickstart trained for 8 steps, logged every 2 (rows at steps 1, 2, 4, 6, 8)."""
    run_dir = tmp_path_factory.mktemp("pilot") / "run"
    res = cli("run", str(QUICKSTART), "--run-dir", str(run_dir), "--no-resume",
              "--set", "models.0.training.max_steps=8", "--set", "models.0.training.log_every=2")
    assert res.returncode == 0, res.stdout + res.stderr
    return run_dir


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_the_pilots_own_model_is_planned_at_its_measured_step(pilot_dir):
    logged = rows(pilot_dir)
    assert [r["step"] for r in logged] == [1, 2, 4, 6, 8]
    timed = sorted(r["step_time_s"] for r in logged[2:])  # the second half: past start-up and warm-up
    res = cli("plan", str(QUICKSTART), "--calibrate-from", str(pilot_dir), "--format", "json")
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert plan["models"][0]["step_time_s"] == pytest.approx(timed[1], rel=1e-9)  # the median of 3
    assert any(a.startswith(f"calibrated from {pilot_dir} (tiny-gpt, zero_stage 0") for a in plan["assumptions"])
    assert not any("fp32 matmul" in a for a in plan["assumptions"])  # no kernel measurement was made


def test_another_model_is_predicted_by_its_flops_at_the_pilots_rate(pilot_dir):
    pilot = read_pilot(pilot_dir)
    big = load_project(QUICKSTART, ["models.0.model.layers=6", "models.0.model.hidden=256",
                                    "models.0.training.global_batch=32", "models.0.training.micro_batch=8"])
    plan = plan_from_pilot(big, pilot_dir)
    shape = ModelShape.from_arch(big.models[0].model, 256)  # the byte tokenizer's vocabulary
    flops_per_step = shape.flops_per_token() * 32 * 128
    assert plan.models[0].step_time_s == pytest.approx(flops_per_step / (2 * pilot.flops_per_rank), rel=1e-9)
    small = plan_from_pilot(load_project(QUICKSTART), pilot_dir).models[0].step_time_s
    assert plan.models[0].step_time_s > 4 * small  # 3.7x the FLOPs per token, twice the tokens per step


def one_error_line(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 2, res.stdout + res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, res.stderr
    assert "--calibrate-from" in lines[0]
    return lines[0]


def test_bad_input_is_one_line_naming_the_option_and_the_fix(pilot_dir, tmp_path):
    line = one_error_line(cli("plan", str(QUICKSTART), "--calibrate-from", str(tmp_path / "nope")))
    assert "no such directory" in line and "clustertrain status" in line

    empty = tmp_path / "empty"
    empty.mkdir()
    line = one_error_line(cli("plan", str(QUICKSTART), "--calibrate-from", str(empty)))
    assert "not a run directory" in line and "run.json" in line and "metrics.jsonl" in line

    short = tmp_path / "short"
    shutil.copytree(pilot_dir, short)
    (short / "metrics.jsonl").write_text(json.dumps(rows(pilot_dir)[0]) + "\n")  # only the start-up interval
    line = one_error_line(cli("plan", str(QUICKSTART), "--calibrate-from", str(short)))
    assert "no timed steps" in line and "log_every" in line

    line = one_error_line(cli("plan", str(P5E), "--calibrate-from", str(pilot_dir)))
    assert "a CPU run cannot calibrate a GPU project" in line

    line = one_error_line(cli("plan", str(QUICKSTART), "--set", "cluster.procs_per_node=1", "--calibrate-from",
                              str(pilot_dir)))
    assert "cluster.procs_per_node" in line and "2 CPU workers per node" in line

    both = cli("plan", str(QUICKSTART), "--calibrate", "--calibrate-from", str(pilot_dir))
    assert both.returncode == 2 and "pass one of them" in both.stderr
