"""`clustertrain rehearse` of a project whose models share nodes (issue 42): the seeds' shape on p5e.48xlarge -- one
8-GPU model on a whole node, two 4-GPU models and three of 2-3 GPUs on shares of nodes (``models[].plan.gpus``) --
on the 80-node emulated cluster with memory-based scheduling (the generated ParallelCluster config enables it, so
the emulated slurm.conf has ``SelectTypeParameters=CR_CPU_Memory``). All six jobs run at once on 3 of the 80
nodes, each share on one node with the GPUs, ``--mem`` and CPUs it asks for, no GPU in two jobs
(``gpus_unshared``), no two jobs on one rendezvous port or directory. Slurm places the jobs itself; observed here
(select/cons_tres, jobs submitted in the file's order): each share goes to the lowest-numbered node it fits, so
the shares land together as planned. The failure modes of the ``shares`` check (``--mem`` not honoured, a node
overfull, one GPU in two jobs, an exclusive share) are tests/unit/rehearsal/test_checks.py's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from clustertrain.plan.packing import job_share
from clustertrain.rehearsal.run import RehearseOptions, rehearse
from clustertrain.resolve import project_from_mapping

pytestmark = pytest.mark.slow
FLAGSHIP = Path(__file__).resolve().parents[3] / "examples" / "p5e-80x7.yaml"
SHARES = {"a": None, "b": 4, "c": 4, "d": 2, "e": 3, "f": 3}   # the seeds' layout: None = a whole node


@pytest.fixture(autouse=True)
def _root():
    if os.geteuid() != 0:
        pytest.skip("the rehearsal needs root (mount namespaces, slurmd as SlurmUser=root)")


def shared_project(nodes: int = 80):
    raw = yaml.safe_load(FLAGSHIP.read_text())
    first = raw["models"][0]
    training = dict(first["training"], global_batch=48)  # a multiple of dp 2, 3, 4 and 8
    raw["models"] = [dict(first, name=f"model-{k}", plan={"gpus": g} if g else {"nodes": 1}, training=training)
                     for k, g in SHARES.items()]
    raw["aws"]["queues"][0]["max_count"] = nodes
    raw["plan"]["cluster_nodes"] = nodes
    raw["cluster"]["nodes"] = 1
    return project_from_mapping(raw, source="the seeds' shared-node layout on p5e")


def test_models_that_share_nodes_run_together_each_on_its_share(tmp_path):
    """About 15 s: 80 nodes boot, six jobs, one of them whole-node (--exclusive), five shares."""
    project = shared_project()
    rdir = tmp_path / "r"
    report = rehearse(project, RehearseOptions(dir=rdir, keep=False))
    assert report.ok, {c.name: c.details for c in report.failed}
    shares = next(c for c in report.checks if c.name == "shares")
    assert shares.ok is True and shares.details == []
    jobs = {j["model"]: j for j in report.jobs}
    assert all(j["state"] == "RUNNING" and len(j["nodes"]) == 1 for j in jobs.values()), jobs
    assert (report.nodes, report.gpus) == (80, 640)
    assert len({n for j in jobs.values() for n in j["nodes"]}) == 3   # six jobs, three nodes: shares co-located
    assert jobs["model-b"]["nodes"] == jobs["model-c"]["nodes"]        # 4 + 4: one node, as planned
    assert len({jobs[m]["nodes"][0] for m in ("model-d", "model-e", "model-f")}) == 1  # 2 + 3 + 3: one node
    assert "SelectTypeParameters=CR_CPU_Memory" in (rdir / "slurm" / "slurm.conf").read_text()
    share = job_share(project, project.model("model-b"))
    assert share is not None and share.gpus == 4 and share.mem_mb == int(2048 * 1024 * 0.95) * 4 // 8



def test_the_shared_nodes_example_rehearses_as_planned(tmp_path):
    """examples/shared-nodes.yaml (3 nodes, the seeds' layout): the jobs land on the nodes pack() plans, no more."""
    from clustertrain.plan.packing import pack
    from clustertrain.resolve import load_project

    project = load_project(FLAGSHIP.parent / "shared-nodes.yaml")
    report = rehearse(project, RehearseOptions(dir=tmp_path / "r", keep=False))
    assert report.ok, {c.name: c.details for c in report.failed}
    jobs = {j["model"]: j["nodes"][0] for j in report.jobs}
    for node in pack(project).nodes:  # the models one shared node holds in the plan share one node here
        assert len({jobs[m] for m in node.models}) == 1, (node.models, jobs)
    assert len(set(jobs.values())) == 3 and jobs["model-a"] not in {jobs[m] for m in ("model-b", "model-d")}
