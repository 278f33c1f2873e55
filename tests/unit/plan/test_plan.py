"""make_plan / render_plan on the project files, the instance catalog, and the `plan` command's exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from clustertrain.core.errors import ConfigError
from clustertrain.plan.catalog import find_instance, load_catalog
from clustertrain.plan.config import InstanceConfig, PlanConfig, PriceConfig
from clustertrain.plan.plan import make_plan
from clustertrain.plan.render import render_plan
from clustertrain.resolve import load_project

ROOT = Path(__file__).resolve().parents[3]
P5E = ROOT / "examples" / "p5e-80x7.yaml"
QUICKSTART = ROOT / "examples" / "quickstart.yaml"


#: every model replicated (DDP): what the trainer did before FSDP2 — the seed's models cannot fit
DDP = [f"models.{i}.parallelism.zero_stage=0" for i in range(7)]


@pytest.fixture(scope="module")
def flagship():
    return make_plan(load_project(P5E))


@pytest.fixture(scope="module")
def ddp_plan():
    return make_plan(load_project(P5E, DDP))


def test_flagship_is_the_seeds_plan_with_the_layouts_it_carries(flagship):
    c = flagship.cluster
    assert (c.nodes, c.gpus, c.vcpus, c.memory_gib) == (80, 640, 15_360, 80 * 2048)
    assert c.cost_per_hour == pytest.approx(2768.0)
    assert flagship.feasible
    assert [m.nodes for m in flagship.models] == [11] * 6 + [14]
    assert all(7 <= m.days <= 14 for m in flagship.models)       # "1-2 weeks each"
    small, large = flagship.models[0], flagship.models[6]
    assert small.layout == {"world": 88, "dp": 88, "tp": 1, "pp": 1, "virtual_stages": 1, "schedule": "1f1b",
                            "zero_stage": 3, "reshard_after_forward": False, "recompute": "none",
                            "sequence_parallel": False, "compile": False, "param_dtype": "bf16", "reduce_dtype": "fp32",
                            "grad_sync": "per_step"}
    assert large.layout["world"] == 112
    assert large.layout_text.startswith("fsdp 112, grads reduced once per step, bf16 params / fp32 reduce")
    # models 1-6 are one architecture (Llama 3 8B's shape on a 32k vocabulary), model 7 the 13.9B of the same family
    assert [round(m.params / 1e9, 2) for m in flagship.models] == [7.24] * 6 + [13.85]
    assert all(m.architecture == small.architecture for m in flagship.models[:6])
    assert small.architecture.startswith("32 layers, hidden 4096, 32 heads, ffn 14336; Llama-style: rope, GQA 8 kv heads")
    assert large.architecture.startswith("40 layers, hidden 5120, 40 heads, ffn 17920; Llama-style: rope, GQA 8 kv heads")
    # from first principles (docstring of plan/memory.py): fp32 weights, gradients and AdamW (4 + 4 + 8 B) sharded over
    # dp; per_step keeps every block gathered in bf16 with its unsharded fp32 gradient (2 + 4 B per parameter)
    GiB = 1024**3
    for m, dp in ((small, 88), (large, 112)):
        assert m.params / dp <= m.memory["params"] < 1.01 * m.params / dp
        assert m.memory["weights"] == m.memory["grads"] == 4 * m.memory["params"]
        assert 0 <= m.memory["optimizer"] - 8 * m.memory["params"] < 4 * 1000  # + 4 B per tensor (AdamW's step)
        assert m.memory["buffers"] == (2 + 4) * m.params
        assert m.memory["total"] == (16 * m.memory["params"] + (m.memory["optimizer"] - 8 * m.memory["params"])
                                     + m.memory["buffers"] + m.memory["activations"] + 3 * GiB)
        assert m.per_step is None and m.dp_traffic["grad_sync"] == "per_step" and m.dp_traffic["reduces"] == 1
    # what the example's comments say: 65.8 and 114.7 GiB of 126.4 usable, per_step's price on model 7
    assert 0.5 * small.memory_budget_bytes < small.memory["total"] < 0.6 * small.memory_budget_bytes
    assert 0.9 * large.memory_budget_bytes < large.memory["total"] < large.memory_budget_bytes
    assert round(small.memory["total"] / GiB, 1) == 65.8 and round(large.memory["total"] / GiB, 1) == 114.7
    assert 10 <= max(m.days for m in flagship.models) < 11                  # "about 10.5 days"
    text = render_plan(flagship, "table")
    for needle in ("640", "15,360", "160 TiB", "$2,768.00/h", "allocation: 6 x 11 + 1 x 14 nodes", "fsdp 88", "fsdp 112",
                   "memory per GPU (rank 0, the most loaded)", "65.8 GiB", "114.7 GiB", "126.4 GiB", "10.5 d (1.5 weeks)",
                   "7.24B", "13.85B", "feasible"):
        assert needle in text, needle


def test_under_ddp_the_flagship_needs_172_and_319_gib_and_the_hint_names_the_fields(flagship, ddp_plan):
    assert not ddp_plan.feasible
    small, large = ddp_plan.models[0], ddp_plan.models[6]
    assert "needs 172.4 GiB per GPU (ddp 616, bf16 params)" in small.reasons[0]
    assert "needs 319.3 GiB per GPU (ddp 616, bf16 params)" in large.reasons[0]
    # from first principles: every rank holds fp32 weights, gradients and AdamW (16 B per parameter), DDP's gradient
    # buckets (4 B) and autocast's bf16 copy (2 B), the framework's 3 GiB, and the same activations as under FSDP2
    GiB = 1024**3
    for ddp, fsdp, needs, states in ((small, flagship.models[0], 172.4, 108), (large, flagship.models[6], 319.3, 206)):
        assert (22 * ddp.params + fsdp.memory["activations"]) / GiB + 3 == pytest.approx(needs, abs=0.05)
        assert round(16 * ddp.params / GiB) == states  # the example's comment: "108 GiB ... and 206 GiB" before activations
    assert "try parallelism.zero_stage: 3, parallelism.pp: 2 (each rank then holds half the layers" in small.reasons[0]
    assert "try parallelism.zero_stage: 3, parallelism.pp: 4 (each rank then holds a quarter of the layers" in large.reasons[0]
    text = render_plan(ddp_plan, "table")
    assert "infeasible: model-7: does not fit: needs 319.3 GiB" in text and "NOT feasible" in text


def test_json_and_markdown_carry_the_same_numbers(flagship, ddp_plan):
    doc = json.loads(render_plan(flagship, "json"))
    assert doc["version"] == 2 and doc["feasible"] is True
    assert doc["cluster"]["gpus"] == 640 and doc["cluster"]["price_region"] == "ap-southeast-3"
    assert doc["cluster"]["region"] == "ap-southeast-3" and doc["cluster"]["price_note"] is None
    assert [m["nodes"] for m in doc["models"]] == [11] * 6 + [14]
    m7 = doc["models"][6]
    assert m7["memory"]["total"] <= m7["memory_budget_bytes"]
    assert m7["total_flops"] == pytest.approx(m7["flops_per_token"] * 460e9)
    assert m7["layout"]["zero_stage"] == 3 and m7["layout"]["dp"] == 112 and m7["parallelism"]["param_dtype"] == "bf16"
    md = render_plan(flagship, "markdown")
    assert "| vCPUs | 15,360 |" in md and "Allocation: 6 x 11 + 1 x 14 nodes" in md
    assert "| model-7 | fsdp 112, grads reduced once per step, bf16 params / fp32 reduce, no reshard after forward |" in md
    doc = json.loads(render_plan(ddp_plan, "json"))
    assert doc["models"][0]["layout"] is None and doc["models"][0]["parallelism"]["zero_stage"] == 0
    assert "- infeasible: model-1: does not fit" in render_plan(ddp_plan, "markdown")


@pytest.mark.parametrize("key,message", [
    ("plan.zero_stage=1", r"plan: plan\.zero_stage moved to models\[\]\.parallelism\.zero_stage \(0 = DDP, 3 = FSDP2\); "
                          r"the planner and the trainer read the same field"),
    ("plan.recompute=full", r"plan\.recompute moved to models\[\]\.parallelism\.recompute"),
    ("plan.sequence_parallel=true", r"plan\.sequence_parallel moved to models\[\]\.parallelism\.sequence_parallel"),
    ("plan.bf16_weights=bf16", r"plan\.bf16_weights is gone: set models\[\]\.parallelism\.param_dtype"),
    ("models.model-7.plan.tp=2", r"models\[6\]\.plan: tp moved to models\[\]\.parallelism\.tp;"),
    ("models.0.plan.zero_stage=3", r"models\[0\]\.plan: zero_stage moved to models\[\]\.parallelism\.zero_stage"),
    ("models.0.plan.pp=2", r"models\[0\]\.plan: pp moved to models\[\]\.parallelism\.pp"),
])
def test_removed_planning_keys_say_where_they_moved(key, message):
    with pytest.raises(ConfigError, match=message) as err:
        load_project(P5E, [key])
    assert "\n" not in str(err.value)


def test_an_override_of_one_model_leaves_the_others_sharing_its_yaml_anchor():
    plan = make_plan(load_project(P5E, ["models.model-1.parallelism.recompute=full"]))
    assert [m.layout["recompute"] for m in plan.models] == ["full"] + ["none"] * 6


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
    assert m.memory["weights"] == 4 * m.params                     # DDP: the whole model on every rank
    assert m.layout["param_dtype"] == "fp32" and m.layout_text == "ddp 2, fp32 params"   # auto = fp32 on CPU workers


def _cli():
    from clustertrain.cli.plan import plan_command

    app = typer.Typer()
    app.command("plan")(plan_command)
    app.command("other")(lambda: None)  # keep `plan` a sub-command as in the real app
    return app


def test_cli_exit_codes():
    runner = CliRunner()
    ok = runner.invoke(_cli(), ["plan", str(P5E), "--format", "json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["cluster"]["vcpus"] == 15_360
    ddp = runner.invoke(_cli(), ["plan", str(P5E), "--format", "json", *(a for s in DDP for a in ("--set", s))])
    assert ddp.exit_code == 2 and json.loads(ddp.output)["feasible"] is False  # replicated, the models do not fit
    # exit 2, as `check` exits on the same problem (the plan still printed, to stdout)
    tight = runner.invoke(_cli(), ["plan", str(P5E), "--set", "models.model-7.plan.deadline_days=5"])
    assert tight.exit_code == 2           # model-7 alone needs 77 nodes to finish in 5 days
    assert "problem: the feasible models need at least 83 nodes together" in tight.output and "model-7 77)" in tight.output
    late = runner.invoke(_cli(), ["plan", str(P5E), "--set", "models.model-7.plan.deadline_days=1"])
    assert late.exit_code == 2
    assert "infeasible: model-7: takes " in late.output and "over the deadline of 1 days" in late.output
    wrong = runner.invoke(_cli(), ["plan", str(P5E), "--format", "xml"])
    assert wrong.exit_code == 2 and "Invalid value for '--format'" in wrong.output  # typer checks the choice
    missing = runner.invoke(_cli(), ["plan", "no-such.yaml"])
    assert isinstance(missing.exception, ConfigError)            # clustertrain.cli.main turns it into exit 2
    moved = runner.invoke(_cli(), ["plan", str(P5E), "--set", "plan.zero_stage=3"])
    assert isinstance(moved.exception, ConfigError) and "moved to models[].parallelism.zero_stage" in str(moved.exception)


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


#: model-7 pinned to a shape these tests name, whatever the flagship's own architecture is
M7 = [f"models.model-7.model.{k}={v}" for k, v in (("layers", 40), ("hidden", 5120), ("heads", 40), ("ffn_hidden", 20480))]
M7_LLAMA = [*M7, *(f"models.model-7.model.{k}={v}" for k, v in (
    ("position", "rope"), ("kv_heads", 8), ("bias", "false"), ("norm", "rmsnorm"), ("mlp", "swiglu"),
    ("tie_embeddings", "false")))]


def test_the_plan_names_each_models_architecture():
    plan = make_plan(load_project(P5E, M7_LLAMA))
    line = ("model-7: 40 layers, hidden 5120, 40 heads, ffn 20480; Llama-style: rope, GQA 8 kv heads, RMSNorm, SwiGLU, "
            "no bias, untied")
    assert f"  - {line}" in render_plan(plan, "table", 400).splitlines()
    assert f"- {line}" in render_plan(plan, "markdown").splitlines()
    assert json.loads(render_plan(plan, "json"))["models"][6]["architecture"] == line.removeprefix("model-7: ")
    classic = make_plan(load_project(P5E, [*M7, *(f"models.model-7.model.{k}={v}" for k, v in (
        ("position", "learned"), ("kv_heads", "null"), ("bias", "true"), ("norm", "layernorm"), ("mlp", "gelu"),
        ("tie_embeddings", "true")))]))
    assert classic.model("model-7").architecture.endswith(
        "; GPT-style: learned positions, MHA, LayerNorm, GELU, biases, tied")
    # GQA: wk and wv are 8 x 128 = 1024 rows instead of 5120 in each of the 40 blocks
    mha = make_plan(load_project(P5E, [*M7_LLAMA, "models.model-7.model.kv_heads=null"])).model("model-7")
    assert mha.architecture.endswith("; Llama-style: rope, MHA, RMSNorm, SwiGLU, no bias, untied")
    assert mha.params - plan.model("model-7").params == 40 * 2 * 5120 * (5120 - 1024)


@pytest.mark.parametrize("command", ["plan", "check"])
def test_tp_that_does_not_divide_kv_heads_is_refused_in_one_line(command, capsys):
    from clustertrain.cli import main

    with pytest.raises(SystemExit) as done:
        main([command, str(P5E), *(a for s in [*M7, "models.model-7.model.kv_heads=4",
                                               "models.model-7.parallelism.tp=8"] for a in ("--set", s))])
    out = capsys.readouterr()
    assert done.value.code == 2
    lines = [ln for ln in (out.out + out.err).splitlines() if "kv_heads" in ln]
    assert len(lines) == 1, lines
    assert "models[6].parallelism.tp: tp=8 does not divide model.kv_heads=4" in lines[0] and "valid tp: 1, 2, 4" in lines[0]
