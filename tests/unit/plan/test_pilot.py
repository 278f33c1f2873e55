"""clustertrain.plan.pilot on what needs no run here: refusals, and a GPU pilot recorded on an H200
(tests/integration/plan/test_calibrate_from.py trains a CPU pilot and reads its directory)."""

from __future__ import annotations

from pathlib import Path

import pytest

from clustertrain.core.errors import ConfigError
from clustertrain.plan.pilot import plan_from_pilot, read_pilot
from clustertrain.plan.plan import make_plan
from clustertrain.resolve import load_project


def test_a_missing_directory_is_named_with_the_option_and_the_fix(tmp_path):
    with pytest.raises(ConfigError) as e:
        read_pilot(tmp_path / "no such run")
    assert str(e.value) == (f"--calibrate-from {tmp_path / 'no such run'}: no such directory; pass the run directory "
                            "of a run that trained for some steps (`clustertrain status` prints it)")


def test_a_directory_without_a_runs_records_is_not_a_pilot(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 10, "step_time_s": 0.1}\n')
    with pytest.raises(ConfigError) as e:
        read_pilot(tmp_path)
    assert "not a run directory with logged steps (no run.json, config.yaml)" in str(e.value)
    assert "\n" not in str(e.value)


H200_PILOT = Path(__file__).parent / "data" / "h200-pilot"  # a real run's records (README.md there says how)
ROOT = Path(__file__).resolve().parents[3]
P5E = ROOT / "examples" / "p5e-80x7.yaml"
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
#: the overrides the recorded pilot ran with (its README's command)
PILOT_SETS = ["cluster.gpus_per_node=1", "cluster.procs_per_node=1", "cluster.instance_type=p5e.48xlarge",
              "models.0.model.layers=12", "models.0.model.hidden=1024", "models.0.model.heads=16",
              "models.0.model.seq_len=1024", "models.0.training.micro_batch=8", "models.0.training.global_batch=8",
              "models.0.training.max_steps=60", "models.0.training.log_every=5"]


def test_a_gpu_pilot_is_read_from_the_second_half_of_its_rows():
    pilot = read_pilot(H200_PILOT)
    assert pilot.on_gpu and pilot.model == "tiny-gpt" and pilot.world_size == 1
    assert (pilot.timed_rows, pilot.last_step) == (7, 60)          # 13 rows at steps 1, 5, ..., 60: steps 30-60
    assert pilot.mfu == 0.1805 and pilot.step_time_s == 0.04507    # the medians of those rows


def test_the_pilots_own_model_is_planned_at_its_measured_step():
    """The trainer's MFU (its FLOPs formula, the catalog's H200 peak) and the planner's step arithmetic agree: the
    pilot's own model comes back at the pilot's measured step (to the 4 digits mfu is recorded with)."""
    plan = plan_from_pilot(load_project(QUICKSTART, PILOT_SETS), H200_PILOT)
    assert plan.models[0].mfu == 0.1805
    assert plan.models[0].step_time_s == pytest.approx(0.04507, rel=1e-3)
    assert plan.assumptions[0].startswith(f"calibrated from {H200_PILOT} (tiny-gpt, zero_stage 0, tp 1, pp 1, "
                                          "1 GPU(s) of p5e.48xlarge): median step 0.04507 s over 7 logged")
    assert any("MFU 18.1% (the pilot's)" in a for a in plan.assumptions)


def test_a_gpu_pilot_plans_the_flagship_at_its_mfu():
    default = make_plan(load_project(P5E))
    plan = plan_from_pilot(load_project(P5E), H200_PILOT)
    assert [m.mfu for m in plan.models] == [0.1805] * len(plan.models)
    for before, after in zip(default.models, plan.models):
        assert after.step_time_s == pytest.approx(before.step_time_s * before.mfu / 0.1805, rel=1e-9)


@pytest.mark.parametrize("project, sets, says", [
    (P5E, ["cluster.instance_type=p5.48xlarge"],
     "the run used H200 141GB GPUs (p5e.48xlarge), this project plans for H100 80GB (p5.48xlarge): MFU differs"),
    (QUICKSTART, [], "a GPU run cannot calibrate a CPU project (cluster.gpus_per_node 1 there, 0 here)"),
    (P5E, ["models.model-1.framework=megatron"], "a builtin run cannot calibrate megatron models"),
])
def test_a_gpu_pilot_refuses_what_it_cannot_calibrate(project, sets, says):
    with pytest.raises(ConfigError) as e:
        plan_from_pilot(load_project(project, sets), H200_PILOT)
    assert str(e.value).startswith(f"--calibrate-from {H200_PILOT}: ") and says in str(e.value)
