"""The submit-time exclusion of suspect nodes, on what Slurm says (clustertrain.launch.exclusion): the rules on
given answers, the path with no Slurm to ask, and the parser on real `scontrol show node -o` text. The same
rules against a running Slurm cluster: tests/integration/launch/test_nodes_cli.py."""

from __future__ import annotations

import pytest

from clustertrain.launch.exclusion import Exclusion, SlurmNode, decide, exclusions, parse_node_hosts
from clustertrain.core.storage_layout import storage_layout
from clustertrain.monitor.suspects import Suspect, add_suspect
from clustertrain.resolve import load_project

NOW = 1_795_000_000.0
#: two lines of `scontrol show node -o` from the local cluster (Slurm 22.05), shortened in the middle
SCONTROL = (
    "NodeName=node1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUTot=1 AvailableFeatures=(null) NodeAddr=127.0.0.1 "
    "NodeHostName=vm Port=60007 Version=22.05.8 OS=Linux 6.18.44 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=24105 "
    "State=IDLE ThreadsPerCore=1 Partitions=debug  BootTime=2026-11-22T21:32:01\n"
    "NodeName=gpu-st-p5e-2 Arch=x86_64 NodeAddr=10.0.1.23 NodeHostName=ip-10-0-1-23 State=ALLOCATED "
    "Partitions=gpu,all  BootTime=2026-11-22T21:32:01\n"
)


def suspect(node: str, host: str | None = "vm", source: str = "hang", job: str | None = "42") -> Suspect:
    return Suspect(time=NOW, node=node, host=host, source=source, reason=f"rank 1 stuck on {node}", job=job,
                   expires=NOW + 3600)


def cluster(*names: str, host: str = "vm", partitions: tuple[str, ...] = ("debug",)) -> dict[str, SlurmNode]:
    return {n: SlurmNode(host, partitions) for n in names}


def test_a_suspect_that_is_still_the_same_machine_is_excluded_and_said():
    ex = decide({"node2": suspect("node2"), "node3": suspect("node3", host=None)}, cluster("node1", "node2", "node3"),
                "debug", nodes_needed=1)
    assert ex.exclude == ["node2", "node3"]  # no host recorded: nothing says it was replaced
    assert ex.notes == ["excluding suspect node(s): node2 (hang, job 42: rank 1 stuck on node2); "
                        "node3 (hang, job 42: rank 1 stuck on node3)"]


def test_a_replaced_instance_and_an_unknown_node_are_dropped_with_a_note_each():
    nodes = {**cluster("node1", "node3"), "node2": SlurmNode("ip-10-0-7-7", ("debug",))}
    ex = decide({"node2": suspect("node2", host="ip-10-0-1-23"), "node9": suspect("node9")}, nodes, "debug", 1)
    assert ex.exclude == []
    replaced, unknown = ex.notes  # in node order
    assert "node2 not excluded: Slurm runs it on ip-10-0-7-7 now, not on ip-10-0-1-23" in replaced
    assert "the instance was replaced" in replaced
    assert "node9 is not a node of this Slurm cluster" in unknown
    assert "clustertrain nodes clear PROJECT node9" in unknown


def test_too_few_nodes_left_in_the_partition_excludes_nothing_and_says_why_in_one_line():
    active = {"node1": suspect("node1"), "node2": suspect("node2")}
    ex = decide(active, cluster("node1", "node2", "node3"), "debug", nodes_needed=2)
    assert ex.exclude == []
    [note] = ex.notes
    assert "node1, node2 not excluded: partition debug has 3 nodes, 1 without them, and the job needs 2" in note
    assert note.endswith("`clustertrain nodes clear PROJECT node1 node2`") and "\n" not in note
    assert decide(active, cluster("node1", "node2", "node3"), "debug", nodes_needed=1).exclude == ["node1", "node2"]


def test_only_nodes_of_the_jobs_partition_count_toward_what_is_left():
    nodes = {**cluster("g1", "g2", partitions=("gpu",)), **cluster("c1", "c2", "c3", partitions=("cpu",))}
    active = {"g1": suspect("g1")}
    assert decide(active, nodes, "gpu", nodes_needed=2).exclude == []  # 1 gpu node left, 3 cpu ones do not help
    assert decide(active, nodes, "gpu", nodes_needed=1).exclude == ["g1"]
    assert decide(active, nodes, None, nodes_needed=4).exclude == ["g1"]  # no partition known: every node counts


def test_scontrol_text_gives_each_nodes_host_and_partitions():
    nodes = parse_node_hosts(SCONTROL)
    assert nodes == {"node1": SlurmNode("vm", ("debug",)), "gpu-st-p5e-2": SlurmNode("ip-10-0-1-23", ("gpu", "all"))}


@pytest.fixture
def project(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(f"name: ex\ncluster: {{backend: slurm, nodes: 2, gpus_per_node: 0, procs_per_node: 1}}\n"
                    f"storage: {{root: {tmp_path / 'store'}}}\n"
                    "models: [{name: m, model: {layers: 2, hidden: 64, heads: 4, seq_len: 64}, "
                    "training: {max_steps: 4}}]\n")
    return load_project(path)


def test_no_suspects_asks_no_slurm_and_without_slurm_every_active_suspect_is_excluded(project, tmp_path):
    no_slurm = {"PATH": str(tmp_path / "empty")}  # no scontrol on this PATH
    assert exclusions(project, no_slurm, nodes_needed=2) == Exclusion()  # nothing to ask about: no note either
    path = storage_layout(project).suspects_file()
    add_suspect(path, "node2", source="hang", reason="stuck", ttl_h=1, host="ip-1")
    add_suspect(path, "node1", source="manual", reason="old", ttl_h=1, now=NOW)  # expired long ago
    ex = exclusions(project, no_slurm, nodes_needed=2)
    assert ex.exclude == ["node2"]
    [note] = ex.notes
    assert note.startswith("excluding suspect node(s) node2 unchecked: Slurm could not be asked")
    assert "`scontrol` not found" in note
