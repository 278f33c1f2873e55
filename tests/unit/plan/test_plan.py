"""make_plan / render_plan on the project files, the instance catalog, and the `plan` command's exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from clustertrain.errors import ConfigError
from clustertrain.plan import frameworks
from clustertrain.plan.catalog import find_instance, load_catalog
from clustertrain.plan.frameworks import Framework
from clustertrain.plan.config import InstanceConfig, PlanConfig, PriceConfig
from clustertrain.plan.plan import make_plan
from clustertrain.plan.render import render_plan
from clustertrain.project import load_project

ROOT = Path(__file__).resolve().parents[3]
P5E = ROOT / "examples" / "p5e-80x7.yaml"
QUICKSTART = ROOT / "examples" / "quickstart.yaml"


#: a framework that implements ZeRO and bf16 weights: what the FSDP2/TP issue adds; with it the flagship is the seed's plan
ZERO = Framework("zero", "a ZeRO-capable test framework", zero_stages=(0, 1, 2, 3), tp=(1,), pp=(1,), weights=("bf16", "fp32"),
                 recompute=("none",), sequence_parallel=False, flash_attention=True)


@pytest.fixture(scope="module")
def builtin_plan():
    return make_plan(load_project(P5E))


@pytest.fixture(scope="module")
def zero1_plan():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(frameworks, "framework_of", lambda entry: ZERO)
        return make_plan(load_project(P5E, ["plan.bf16_weights=bf16"]))


def test_flagship_is_planned_for_the_builtin_trainer_and_is_infeasible(builtin_plan):
    """The trainer is DDP with fp32 weights: ZeRO-1 (asked for by plan.zero_stage) is not what it runs."""
    c = builtin_plan.cluster
    assert (c.nodes, c.gpus, c.vcpus, c.memory_gib) == (80, 640, 15_360, 80 * 2048)
    assert c.cost_per_hour == pytest.approx(2768.0)
    assert not builtin_plan.feasible
    small, large = builtin_plan.models[0], builtin_plan.models[6]
    assert (small.zero_stage, small.framework, small.bf16_weights) == (0, "builtin", "fp32")
    assert small.adjustments == ["plan.zero_stage: 1 is not implemented by the builtin framework; planned with 0"]
    assert "needs 154.6 GiB per GPU" in small.reasons[0] and "needs 290.2 GiB per GPU" in large.reasons[0]
    text = render_plan(builtin_plan, "table")
    for needle in ("adjusted (every model): plan.zero_stage: 1 is not implemented by the builtin framework; planned with 0",
                   "framework of every model: the built-in trainer", "infeasible: model-7: does not fit: needs 290.2 GiB",
                   "NOT feasible"):
        assert needle in text, needle


def test_with_a_zero1_framework_the_flagship_reproduces_the_seed(zero1_plan):
    c = zero1_plan.cluster
    assert c.cost_per_hour == pytest.approx(2768.0)
    assert zero1_plan.feasible and not zero1_plan.adjustments
    assert [m.nodes for m in zero1_plan.models] == [11] * 6 + [14]
    assert all(7 <= m.days <= 14 for m in zero1_plan.models)       # "1-2 weeks each"
    text = render_plan(zero1_plan, "table")
    for needle in ("640", "15,360", "160 TiB", "$2,768.00/h", "allocation: 6 x 11 + 1 x 14 nodes", "feasible"):
        assert needle in text, needle


def test_json_and_markdown_carry_the_same_numbers(zero1_plan, builtin_plan):
    doc = json.loads(render_plan(zero1_plan, "json"))
    assert doc["version"] == 1 and doc["feasible"] is True
    assert doc["cluster"]["gpus"] == 640 and doc["cluster"]["price_region"] == "ap-southeast-3"
    assert doc["cluster"]["region"] == "ap-southeast-3" and doc["cluster"]["price_note"] is None
    assert [m["nodes"] for m in doc["models"]] == [11] * 6 + [14]
    m7 = doc["models"][6]
    assert m7["memory"]["total"] <= m7["memory_budget_bytes"]
    assert m7["total_flops"] == pytest.approx(m7["flops_per_token"] * 460e9)
    md = render_plan(zero1_plan, "markdown")
    assert "| vCPUs | 15,360 |" in md and "Allocation: 6 x 11 + 1 x 14 nodes" in md
    doc = json.loads(render_plan(builtin_plan, "json"))
    assert doc["models"][0]["adjustments"] and doc["models"][0]["framework"] == "builtin"
    assert "- adjusted (every model): plan.zero_stage: 1" in render_plan(builtin_plan, "markdown")


def test_price_applies_only_in_the_projects_region():
    project = load_project(P5E, ["plan.price=null"])
    plan = make_plan(project)
    assert plan.cluster.cost_per_hour == pytest.approx(80 * 34.60)  # catalog entry holds the seed's quote
    # p5's catalog price is a us-east-1 list price: never shown as if it applied in ap-southeast-3
    p5 = make_plan(load_project(P5E, ["plan.price=null", "cluster.instance_type=p5.48xlarge",
                                      "aws.queues.0.instance_type=p5.48xlarge"]))
    assert p5.cluster.cost_per_hour is None and p5.cluster.cost_usd is None
    assert all(m.cost_usd is None for m in p5.models)
    assert p5.cluster.price_note.startswith("no price for ap-southeast-3: the catalog's p5.48xlarge price is for us-east-1")
    text = render_plan(p5, "table")
    assert "us-east-1" in text and "$55.04/h, 2025-06-01) and is not used" in text and "55.04/h per node" not in text
    # the same catalog price applies in its own region ...
    east = make_plan(load_project(P5E, ["plan.price=null", "cluster.instance_type=p5.48xlarge", "aws.region=us-east-1",
                                        "aws.availability_zone=us-east-1a", "storage.region=us-east-1",
                                        "aws.queues.0.instance_type=p5.48xlarge"]))
    assert east.cluster.price_per_hour == load_catalog()["p5.48xlarge"].price.per_hour and east.cluster.price_note is None
    # ... and a plan.price for another region is not used either
    moved = make_plan(load_project(P5E, ["plan.price.region=us-west-2"]))
    assert moved.cluster.cost_per_hour is None and "plan.price is for us-west-2" in moved.cluster.price_note
    # a project that names no region uses the price as given, with its region shown
    assert make_plan(load_project(QUICKSTART)).cluster.region is None


def test_catalog_has_the_required_types_with_every_field():
    cat = load_catalog()
    for name in ("p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge", "p4d.24xlarge", "p4de.24xlarge", "g5.48xlarge", "g6e.48xlarge"):
        inst = cat[name]
        assert inst.gpus >= 4 and inst.peak_bf16_tflops > 0 and inst.vcpus > 0 and inst.memory_gib > 0
        assert inst.price.per_hour > 0 and inst.price.region and inst.price.date


def test_catalog_overrides_merge_and_new_types_need_hardware():
    plan = PlanConfig(instances={"p5.48xlarge": InstanceConfig(assumed_mfu=0.5)},
                      price=PriceConfig(per_hour=40.0, region="us-west-2", date="2026-10-01"))
    inst = find_instance(load_catalog(plan), "p5.48xlarge", plan)
    assert inst.assumed_mfu == 0.5 and inst.gpus == 8 and inst.price.per_hour == 40.0
    with pytest.raises(ConfigError, match=r"plan.instances.x1.big: not in the catalog, so it needs gpus, gpu_model"):
        load_catalog(PlanConfig(instances={"x1.big": InstanceConfig(vcpus=4)}))
    with pytest.raises(ConfigError, match=r"cluster.instance_type: 'p9.huge' is not in the instance catalog; known: g5.12xlarge"):
        find_instance(load_catalog(), "p9.huge")


def test_quickstart_plans_cpu_workers_without_prices():
    plan = make_plan(load_project(QUICKSTART))
    m = plan.models[0]
    assert plan.feasible and m.gpus == 2 and m.dp == 2 and m.days is None
    assert m.tokens == 200 * 16 * 128
    assert m.memory["weights"] == 4 * m.params                     # fp32 on CPU


def _cli():
    from clustertrain.cli.plan import plan_command

    app = typer.Typer()
    app.command("plan")(plan_command)
    app.command("other")(lambda: None)  # keep `plan` a sub-command as in the real app
    return app


def test_cli_exit_codes(monkeypatch):
    runner = CliRunner()
    builtin = runner.invoke(_cli(), ["plan", str(P5E), "--format", "json"])
    assert builtin.exit_code == 1 and json.loads(builtin.output)["feasible"] is False  # the trainer cannot run it
    monkeypatch.setattr(frameworks, "framework_of", lambda entry: ZERO)
    ok = runner.invoke(_cli(), ["plan", str(P5E), "--format", "json", "--set", "plan.bf16_weights=bf16"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["cluster"]["vcpus"] == 15_360
    tight = runner.invoke(_cli(), ["plan", str(P5E), "--set", "plan.bf16_weights=bf16", "--set", "models.model-7.plan.deadline_days=5"])
    assert tight.exit_code == 1           # model-7 alone needs 77 nodes to finish in 5 days
    assert "problem: the feasible models need at least 83 nodes together" in tight.output and "model-7 77)" in tight.output
    late = runner.invoke(_cli(), ["plan", str(P5E), "--set", "plan.bf16_weights=bf16", "--set", "models.model-7.plan.deadline_days=1"])
    assert late.exit_code == 1
    assert "infeasible: model-7: takes " in late.output and "over the deadline of 1 days" in late.output
    wrong = runner.invoke(_cli(), ["plan", str(P5E), "--format", "xml"])
    assert wrong.exit_code == 2 and "Invalid value for '--format'" in wrong.output  # typer checks the choice
    missing = runner.invoke(_cli(), ["plan", "no-such.yaml"])
    assert isinstance(missing.exception, ConfigError)            # clustertrain.cli.main turns it into exit 2


@pytest.mark.slow
def test_calibrate_measures_and_predicts_a_cpu_step():
    from clustertrain.plan.calibrate import calibrate

    project = load_project(QUICKSTART)
    cal = calibrate(project, side_by_side=False)
    assert cal.threads >= 1 and cal.flops_per_worker > 1e8
    assert cal.predicted_step_s == pytest.approx(sum(cal.parts_s.values()))
    assert {"gemm", "attention", "optimizer", "allreduce"} <= set(cal.parts_s)
    assert 0 < cal.efficiency < 1
    plan = make_plan(project, cal)
    assert plan.models[0].step_time_s == pytest.approx(cal.predicted_step_s, rel=1e-6)
