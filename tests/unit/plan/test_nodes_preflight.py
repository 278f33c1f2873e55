"""The plan as the other stages use it: each model's node count (nodes_for) and the plan's findings
(plan_findings / submit_blockers) — on the flagship and on differently shaped projects."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from clustertrain.plan.node_counts import nodes_for
from clustertrain.plan.plan import make_plan
from clustertrain.plan.preflight import plan_findings, reason_field, submit_blockers
from clustertrain.project import validate_project
from clustertrain.resolve import load_project

ROOT = Path(__file__).resolve().parents[3]
P5E = ROOT / "examples" / "p5e-80x7.yaml"
DDP = [f"models.{i}.parallelism.zero_stage=0" for i in range(7)]


def fleet(models: list[dict], cluster: dict | None = None, plan: dict | None = None, **extra):
    """A project of 1.3B GPTs (they fit an H200 with DDP); ``models``: per-model overrides (name, tokens, plan,
    parallelism...)."""
    entries = []
    for m in models:
        entry = {"name": m["name"], "model": {"layers": 24, "hidden": 2048, "heads": 16, "seq_len": 4096, "vocab": 32000},
                 "training": {"max_steps": 1000, "micro_batch": 1, "global_batch": m.get("global_batch", 1232)},
                 "parallelism": {"param_dtype": "bf16", **m.get("parallelism", {})},
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


def test_the_flagship_has_no_plan_findings_and_under_ddp_each_model_is_an_error_on_its_parallelism():
    assert plan_findings(load_project(P5E)) == []
    errors = [f for f in plan_findings(load_project(P5E, DDP)) if f.level == "error"]
    assert [f.path for f in errors] == [f"models[{i}].parallelism" for i in range(7)]
    assert "model-1 is infeasible (builtin framework): does not fit: needs 172.4 GiB per GPU" in errors[0].message
    assert "model-7 is infeasible (builtin framework): does not fit: needs 319.3 GiB per GPU" in errors[6].message
    assert "try parallelism.zero_stage: 3, parallelism.pp: 4" in errors[6].message
    assert "models[].parallelism" in errors[6].fix


def test_layout_problems_on_the_allocated_counts_name_the_field():
    """A fixed dp that no count of the shared cluster gives: the finding is on models[1].parallelism.dp."""
    project = fleet([{"name": "a"}, {"name": "b", "parallelism": {"zero_stage": 3, "dp": 100}}], plan={"cluster_nodes": 22})
    [err] = [f for f in plan_findings(project) if f.level == "error"]
    assert err.path == "models[1].parallelism.dp" and "dp=100 x tp=1 x pp=1 = 100 but the job has" in err.message
    assert reason_field(6, "models[6].parallelism.tp: tp=3 does not divide ...")[0] == "models[6].parallelism.tp"
    assert reason_field(0, "does not fit: needs 9 GiB ...; use a smaller model or GPUs with more memory")[0] == "models[0].model"


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


def test_submit_blockers_are_the_errors_of_the_chosen_models():
    project = fleet([{"name": "ok"}, {"name": "bad", "plan": {"nodes": 12}}], plan={"cluster_nodes": 22})
    assert [f.path for f in submit_blockers(project)] == ["models[1].training.global_batch"]
    assert submit_blockers(project, ["ok"]) == []
    assert len(submit_blockers(load_project(P5E, DDP))) == 7
    flagship = load_project(P5E)  # FSDP2: every model fits
    assert submit_blockers(flagship) == [] and nodes_for(flagship)["model-7"] == 14


def test_planning_imports_no_torch_and_is_fast():
    code = ("import sys, time; t = time.perf_counter(); from clustertrain.resolve import load_project; "
            "from clustertrain.plan.node_counts import nodes_for; from clustertrain.plan.preflight import plan_findings; "
            f"p = load_project({str(P5E)!r}); nodes_for(p); plan_findings(p); "
            "assert 'torch' not in sys.modules, 'planning imported torch'; print(time.perf_counter() - t)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout) < 1.5
