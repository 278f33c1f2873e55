"""Models that share nodes (``models[].plan.gpus``, issue 42): the packing (first-fit decreasing), the plan's shared
nodes and cost shares, the node counts the jobs get, and the one-line refusals — on the seeds' example
(examples/shared-nodes.yaml) and on differently shaped projects."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from clustertrain.plan.node_counts import nodes_for
from clustertrain.plan.packing import NodeCapacity, Share, SharedNode, job_share, pack
from clustertrain.plan.plan import make_plan
from clustertrain.plan.preflight import plan_findings, submit_blockers
from clustertrain.plan.render import render_plan
from clustertrain.project import validate_project
from clustertrain.resolve import load_project

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "shared-nodes.yaml"


def shares_project(gpus: list[int | None], cluster_nodes: int | None = None, global_batch: int = 48, **cluster):
    """1.1B GPTs on p5e.48xlarge; ``gpus``: each model's plan.gpus (None: whole nodes, cluster.nodes or allocated)."""
    models = [{"name": f"m{i}", "model": {"layers": 16, "hidden": 2048, "heads": 16, "seq_len": 4096, "vocab": 32000},
               "training": {"max_steps": 1000, "micro_batch": 1, "global_batch": global_batch},
               "plan": {"gpus": g} if g else {}} for i, g in enumerate(gpus)]
    raw = {"name": "sweep", "cluster": {"backend": "slurm", "nodes": 1, "gpus_per_node": 8, "instance_type": "p5e.48xlarge",
                                        **cluster},
           "storage": {"root": "/fsx", "region": "ap-southeast-3"},
           "plan": {"assumed_mfu": 0.4, **({"cluster_nodes": cluster_nodes} if cluster_nodes else {})}, "models": models}
    return validate_project(raw)


def test_the_seeds_example_plans_as_written_and_its_cost_shares_sum_to_the_cluster():
    project = load_project(EXAMPLE)
    plan = make_plan(project)
    assert plan.feasible, plan.problems
    assert [n["models"] for n in plan.shared_nodes] == [["model-b", "model-c"], ["model-d", "model-e", "model-f"]]
    assert plan.cluster.nodes == 3 and plan.cluster.idle_nodes == 0
    whole = plan.model("model-a")
    assert (whole.nodes, whole.shared_node, whole.gpus) == (1, None, 8)
    assert [(plan.model(m).gpus, plan.model(m).shared_node) for m in ("model-b", "model-d", "model-e")] == [(4, 1), (2, 2), (3, 2)]
    per_hour = [m.cost_per_hour for m in plan.models]
    assert sum(per_hour) == pytest.approx(plan.cluster.cost_per_hour) and plan.cluster.cost_per_hour == pytest.approx(3 * 34.60)
    assert plan.model("model-d").cost_per_hour == pytest.approx(34.60 * 2 / 8)
    # each share's layout is on its own GPUs: fsdp over plan.gpus, dp = plan.gpus
    assert plan.model("model-e").dp == 3 and plan.model("model-e").layout_text.startswith("fsdp 3")
    assert nodes_for(project) == {m: 1 for m in ("model-a", "model-b", "model-c", "model-d", "model-e", "model-f")}
    assert not submit_blockers(project)
    text = render_plan(plan, width=200)
    assert "shared node 2: model-d (2 GPUs, $8.65/h), model-e (3 GPUs, $12.98/h), model-f (3 GPUs, $12.98/h)" in text
    assert "cost shares: $103.80/h of the cluster's $103.80/h" in text
    doc = json.loads(render_plan(plan, "json"))
    assert [n["gpus_used"] for n in doc["shared_nodes"]] == [8, 8]
    assert sum(sum(n["cost_per_hour"].values()) for n in doc["shared_nodes"]) == pytest.approx(2 * 34.60)


def test_first_fit_decreasing_packs_tighter_than_the_files_order():
    # in file order (first fit) 3 | 5 | 3 + 5 ... needs 3 nodes; decreasing: 5 + 3, 5 + 3: the lower bound, 2
    project = shares_project([3, 5, 3, 5], global_batch=120)
    packing = pack(project, 34.6)
    assert packing.count == packing.lower_bound == 2
    assert [sorted(s.gpus for s in n.shares) for n in packing.nodes] == [[3, 5], [3, 5]]
    assert all(abs(sum(s.cost_per_hour for s in n.shares) - 34.6) < 1e-9 for n in packing.nodes)
    # a node's idle GPUs are paid by its models: 2 + 2 GPUs on one node pay half each
    lone = pack(shares_project([2, 2], global_batch=48), 34.6)
    assert lone.count == 1 and [s.cost_per_hour for s in lone.nodes[0].shares] == [17.3, 17.3]


def test_a_share_asks_for_its_proportion_of_the_node():
    project = shares_project([3])
    share = job_share(project, project.models[0])
    assert (share.gpus, share.mem_mb, share.cpus_per_gpu) == (3, int(2048 * 1024 * 0.95) * 3 // 8, 192 // 8)
    whole = shares_project([None])
    assert job_share(whole, whole.models[0]) is None


def test_a_node_asked_for_more_than_it_has_names_the_models():
    node = SharedNode(1, (Share("a", 4, 600_000, 96, None), Share("b", 4, 600_000, 96, None)), NodeCapacity(8, 1_000_000, 160))
    problems = node.overflow()
    assert any("host memory 1200000 MB > the node's schedulable 1000000 MB (a (4) + b (4))" in p for p in problems)
    assert any("CPUs 192 > 160 per node" in p for p in problems)
    assert not SharedNode(1, (Share("a", 4, 1, 1, None),), NodeCapacity(8, 10, 10)).overflow()


def test_shared_nodes_are_taken_from_the_cluster_before_whole_node_models_are_allocated():
    plan = make_plan(shares_project([None, None, 4, 4, 2], cluster_nodes=5))
    assert plan.feasible, plan.problems
    assert [n["models"] for n in plan.shared_nodes] == [["m2", "m3"], ["m4"]]
    assert sorted(plan.model(m).nodes for m in ("m0", "m1")) == [1, 2]  # the 3 nodes left, to the whole-node models
    full = make_plan(shares_project([None, 4, 4, 2], cluster_nodes=2))
    assert not full.feasible and "need 2 shared node(s) for m1, m2, m3 and at least one node for m0 but the cluster has 2" \
        in full.problems[0]
    [finding] = [f for f in plan_findings(shares_project([None, 4, 4, 2], cluster_nodes=2)) if f.level == "error"]
    assert finding.path == "plan.cluster_nodes"


def test_a_share_trains_with_the_data_parallel_size_of_its_own_gpus():
    # CPU workers: 2 rank slots a node, a share of 1 slot has dp 1, so global_batch 4 (micro_batch 4) is valid
    raw = yaml.safe_load((ROOT / "examples" / "shared-twin.yaml").read_text())
    for m in raw["models"]:
        m["training"]["global_batch"] = 4
    raw["storage"]["root"] = "/tmp/runs"
    project = validate_project(raw)
    assert [project.dp_size(m) for m in project.models] == [1, 1]
    plan = make_plan(project)
    assert [m.gpus for m in plan.models] == [1, 1] and [n["models"] for n in plan.shared_nodes] == [["model-a", "model-b"]]


@pytest.mark.parametrize("change, expected", [
    ({"gpus": 12}, "models[0].plan.gpus: 12 GPUs span more than one node (8 per node); a model on several nodes takes "
                   "whole nodes: set plan.nodes instead"),
    ({"gpus": 4, "nodes": 2}, "models[0].plan.gpus: a share of a node (4 GPUs) cannot also have plan.nodes (2)"),
])
def test_a_share_that_spans_nodes_is_refused_in_one_line(change, expected):
    raw = {"name": "x", "cluster": {"backend": "slurm", "gpus_per_node": 8},
           "models": [{"name": "m", "model": {"layers": 2, "hidden": 64, "heads": 2, "seq_len": 64},
                       "training": {"max_steps": 10, "global_batch": 48}, "plan": change}]}
    with pytest.raises(Exception) as e:
        validate_project(raw)
    assert expected in str(e.value)


def test_a_share_that_does_not_divide_the_layout_exits_2_naming_the_field(tmp_path):
    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["models"][4]["parallelism"] = {"zero_stage": 3, "tp": 2}   # model-e: 3 GPUs, tp 2
    bad = tmp_path / "p.yaml"
    bad.write_text(yaml.safe_dump(raw))
    r = subprocess.run([sys.executable, "-m", "clustertrain", "plan", str(bad)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1 and "models[4].parallelism.tp" in line and "plan.gpus 3" in line, line
