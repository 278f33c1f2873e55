"""The plan as the other stages use it: each model's framework settings, its node count (nodes_for) and
the plan's findings (plan_findings / submit_blockers) — on the flagship and on differently shaped projects."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from clustertrain.plan import frameworks
from clustertrain.plan.frameworks import BUILTIN, Framework, effective_settings
from clustertrain.plan.nodes import nodes_for
from clustertrain.plan.plan import make_plan
from clustertrain.plan.preflight import plan_findings, reason_field, submit_blockers
from clustertrain.project import load_project, validate_project

ROOT = Path(__file__).resolve().parents[3]
P5E = ROOT / "examples" / "p5e-80x7.yaml"
ZERO = Framework("zero", "test", zero_stages=(0, 1), tp=(1,), pp=(1,), weights=("bf16", "fp32"), recompute=("none",),
                 sequence_parallel=False, flash_attention=True)


def fleet(models: list[dict], cluster: dict | None = None, plan: dict | None = None, **extra):
    """A project of 1.3B GPTs (they fit an H200 with DDP); ``models``: per-model overrides (name, tokens, plan...)."""
    entries = []
    for m in models:
        entry = {"name": m["name"], "model": {"layers": 24, "hidden": 2048, "heads": 16, "seq_len": 4096, "vocab": 32000},
                 "training": {"max_steps": 1000, "micro_batch": 1, "global_batch": m.get("global_batch", 1232)},
                 "parallelism": {"param_dtype": "bf16"},
                 "plan": {"tokens": m.get("tokens", 100_000_000_000), **m.get("plan", {})}}
        entries.append(entry)
    raw = {"name": "fleet", "cluster": {"backend": "slurm", "nodes": 11, "gpus_per_node": 8, "instance_type": "p5e.48xlarge",
                                        **(cluster or {})},
           "storage": {"root": "/fsx"}, "plan": {"assumed_mfu": 0.4, **(plan or {})}, "models": entries, **extra}
    return validate_project(raw)


SEVEN = [{"name": f"model-{i}"} for i in range(1, 7)] + [{"name": "model-7", "tokens": 127_000_000_000}]


def test_submit_node_counts_follow_the_plans_allocation_not_cluster_nodes():
    project = fleet(SEVEN, plan={"cluster_nodes": 80})
    assert project.cluster.nodes == 11
    assert nodes_for(project) == {**{f"model-{i}": 11 for i in range(1, 7)}, "model-7": 14}


def test_a_pinned_node_count_wins_and_without_cluster_nodes_every_model_gets_cluster_nodes():
    pinned = [*SEVEN[:6], {"name": "model-7", "tokens": 127_000_000_000, "plan": {"nodes": 7}}]
    assert nodes_for(fleet(pinned, plan={"cluster_nodes": 80}))["model-7"] == 7
    counts = nodes_for(fleet(pinned, cluster={"nodes": 14}))  # sequential: cluster.nodes, pinned stays
    assert counts == {**{f"model-{i}": 14 for i in range(1, 7)}, "model-7": 7}


def test_other_shapes_other_counts():
    """Not the example's numbers: 3 models on 24 nodes of p5.48xlarge, one with twice the tokens."""
    batch = {"global_batch": 1024}
    project = fleet([{"name": "a", **batch}, {"name": "b", **batch}, {"name": "c", "tokens": 200_000_000_000, **batch}],
                    cluster={"instance_type": "p5.48xlarge", "nodes": 1}, plan={"cluster_nodes": 24})
    assert nodes_for(project) == {"a": 4, "b": 4, "c": 16}


def test_framework_settings_are_what_the_builtin_trainer_does_and_asked_ones_are_reported():
    project = load_project(P5E, ["models.model-7.plan.tp=2"])
    fw, used, adjustments = effective_settings(project, 6, project.models[6])
    assert fw is BUILTIN
    assert used == {"zero_stage": 0, "tp": 1, "pp": 1, "recompute": "none", "sequence_parallel": False, "bf16_weights": "fp32"}
    assert [(a.field, a.asked, a.used) for a in adjustments] == [("plan.zero_stage", 1, 0), ("models[6].plan.tp", 2, 1)]
    quiet = fleet([{"name": "a"}])  # nothing asked for: no adjustment, although bf16 weights are the catalog habit
    assert effective_settings(quiet, 0, quiet.models[0])[2] == []
    asked = fleet([{"name": "a"}], plan={"bf16_weights": "bf16", "recompute": "selective"})
    assert [a.field for a in effective_settings(asked, 0, asked.models[0])[2]] == ["plan.recompute", "plan.bf16_weights"]


def test_flagship_findings_name_each_model_its_field_and_the_framework():
    findings = plan_findings(load_project(P5E))
    errors = [f for f in findings if f.level == "error"]
    assert [f.path for f in errors] == [f"models[{i}].model" for i in range(7)]
    assert "model-7 is infeasible for its framework (builtin): does not fit: needs 290.2 GiB per GPU" in errors[6].message
    [zero] = [f for f in findings if f.path == "plan.zero_stage"]
    assert zero.level == "warning" and "(every model)" in zero.message and "planned with 0" in zero.message


def test_findings_for_other_kinds_of_infeasibility():
    project = fleet([{"name": "a", "plan": {"nodes": 12}}, {"name": "b", "plan": {"nodes": 90}}], plan={"cluster_nodes": 80})
    paths = {f.path: f for f in plan_findings(project) if f.level == "error"}
    assert "models[0].training.global_batch" in paths and "models[1].plan.nodes" in paths
    assert reason_field(3, "takes 9.0 days on ...") == ("models[3].plan.deadline_days",
                                                          "raise the deadline, the node count or the MFU assumption")
    price = [f for f in plan_findings(fleet([{"name": "a"}], cluster={"instance_type": "p5.48xlarge"}),)
             if f.path == "plan.price"]
    assert price == []  # no region named: the catalog price is shown with its region
    east = fleet([{"name": "a"}], cluster={"instance_type": "p5.48xlarge"})
    east.storage.region = "eu-west-1"
    [warn] = [f for f in plan_findings(east) if f.path == "plan.price"]
    assert warn.level == "warning" and "no price for eu-west-1" in warn.message and "region: eu-west-1" in warn.fix


def test_node_sharing_fractions_cannot_be_submitted():
    batch = {"global_batch": 1152}  # dp 4 and 12 divide it: half a node and one and a half
    project = fleet([{"name": "a", **batch}, {"name": "b", "tokens": 30_000_000_000, **batch}], cluster={"nodes": 1},
                    plan={"cluster_nodes": 2, "node_sharing": True})
    assert [m.nodes for m in make_plan(project).models] == [1.5, 0.5]
    assert [f.path for f in submit_blockers(project)] == ["plan.node_sharing"] * 2
    assert nodes_for(project) == {"a": 1, "b": 1}  # cluster.nodes: what submit would refuse anyway


def test_submit_blockers_are_the_errors_of_the_chosen_models(monkeypatch):
    project = fleet([{"name": "ok"}, {"name": "bad", "plan": {"nodes": 12}}], plan={"cluster_nodes": 22})
    assert [f.path for f in submit_blockers(project)] == ["models[1].training.global_batch"]
    assert submit_blockers(project, ["ok"]) == []
    assert len(submit_blockers(load_project(P5E))) == 7
    monkeypatch.setattr(frameworks, "framework_of", lambda entry: ZERO)  # the FSDP2 issue's framework: it fits
    flagship = load_project(P5E, ["plan.bf16_weights=bf16"])
    assert submit_blockers(flagship) == [] and nodes_for(flagship)["model-7"] == 14


def test_planning_imports_no_torch_and_is_fast():
    code = ("import sys, time; t = time.perf_counter(); from clustertrain.project import load_project; "
            "from clustertrain.plan.nodes import nodes_for; from clustertrain.plan.preflight import plan_findings; "
            f"p = load_project({str(P5E)!r}); nodes_for(p); plan_findings(p); "
            "assert 'torch' not in sys.modules, 'planning imported torch'; print(time.perf_counter() - t)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout) < 1.5
