"""`clustertrain nodes list | add | clear` on a project's suspect list, and the exclusion `submit` derives from it
against a real 3-node Slurm cluster: what sbatch accepts and where the job then runs."""

from __future__ import annotations

import json
import re
import socket
import subprocess
from pathlib import Path

import pytest

from clustertrain.cli import main
from clustertrain.launch.exclusion import exclusions
from clustertrain.core.storage_layout import storage_layout
from clustertrain.monitor.suspects import active_suspects, add_suspect
from clustertrain.resolve import load_project
from tests.support.slurm import client_env, local_slurm_cluster, sbatch, wait_job

P5E = Path(__file__).resolve().parents[3] / "examples" / "p5e-80x7.yaml"
PROJECT = """name: sus
cluster: {{backend: slurm, nodes: 2, gpus_per_node: 0, procs_per_node: 1}}
storage: {{root: {root}}}
monitor: {{suspect_ttl_h: 6}}
models: [{{name: m, model: {{layers: 2, hidden: 64, heads: 4, seq_len: 64}}, training: {{max_steps: 4}}}}]
"""


@pytest.fixture
def project_file(tmp_path):
    path = tmp_path / "sus.yaml"
    path.write_text(PROJECT.format(root=json.dumps(str(tmp_path / "store"))))
    return path


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as done:
        main(list(argv))
    out, err = capsys.readouterr()
    return done.value.code, out, err


def suspects_of(project_file):
    return storage_layout(load_project(project_file)).suspects_file()


def test_add_list_clear_round_trip(project_file, capsys):
    p = str(project_file)
    code, out, _ = cli(capsys, "nodes", "add", p, "node2", "gpu[1-2]", "--reason", "XID 79 on GPU 3")
    assert code == 0 and out.count("added ") == 3
    active = active_suspects(suspects_of(project_file))
    assert sorted(active) == ["gpu1", "gpu2", "node2"]
    entry = active["node2"]
    assert (entry.source, entry.reason, entry.host) == ("manual", "XID 79 on GPU 3", None)
    assert entry.expires - entry.time == pytest.approx(6 * 3600)  # monitor.suspect_ttl_h
    code, out, _ = cli(capsys, "nodes", "add", p, "node3", "--reason", "slow", "--hours", "0.5")
    assert code == 0 and active_suspects(suspects_of(project_file))["node3"].expires - entry.time < 3600
    code, out, _ = cli(capsys, "nodes", "list", p)
    lines = out.splitlines()
    assert lines[0].split() == ["node", "source", "job", "model", "added", "expires", "in", "reason"]
    assert [ln.split()[0] for ln in lines[1:]] == ["gpu1", "gpu2", "node2", "node3"]
    assert lines[3].endswith("  XID 79 on GPU 3") and re.search(r"  (5h 59m|6h 00m)  ", lines[3])
    code, out, _ = cli(capsys, "nodes", "clear", p, "gpu1", "node9")
    assert (code, out) == (0, "cleared gpu1\nnot an active suspect: node9\n")
    code, out, _ = cli(capsys, "nodes", "list", p, "--all", "--json")
    states = {(r["node"], r["state"]) for r in json.loads(out)}
    assert states == {("gpu1", "cleared"), ("gpu2", "active"), ("node2", "active"), ("node3", "active")}
    code, out, _ = cli(capsys, "nodes", "clear", p)
    assert (code, out) == (0, "cleared gpu2, node2, node3\n")
    code, out, _ = cli(capsys, "nodes", "list", p)
    assert out.startswith("no active suspect nodes (")
    code, out, _ = cli(capsys, "nodes", "list", p, "--all")
    assert out.splitlines()[0].split()[-2:] == ["state", "reason"] and out.count("cleared") == 4


def test_an_entry_past_its_time_shows_only_in_the_history(project_file, capsys):
    add_suspect(suspects_of(project_file), "node4", source="hang", reason="rank 1 stuck", ttl_h=1, job="42",
                model="m", now=1_000_000.0)
    code, out, _ = cli(capsys, "nodes", "list", str(project_file), "--json")
    assert (code, json.loads(out)) == (0, [])
    code, out, _ = cli(capsys, "nodes", "list", str(project_file), "--all")
    [row] = out.splitlines()[1:]
    assert row.split()[:4] == ["node4", "hang", "42", "m"] and row.split()[-5:] == ["expired", "expired", "rank", "1",
                                                                                     "stuck"]


@pytest.mark.parametrize("argv, message", [
    (["add", "{p}", "node1,node2", "--reason", "x"],
     "node name 'node1,node2': a Slurm node name is not empty and holds no blank or comma"),
    (["add", "{p}", "node 1", "--reason", "x"], "node name 'node 1'"),
    (["add", "{p}", "", "--reason", "x"], "node name ''"),
    (["add", "{p}", "node1", "--reason", "  "], "--reason is empty"),
    (["add", "{p}", "node1", "--reason", "x", "--hours", "0"], "--hours 0: give a number of hours above 0"),
    (["add", "{p}", "node[1-", "--reason", "x"], "hostlist 'node[1-'"),
    (["clear", "{p}", "node1\tnode2"], "node name 'node1\\tnode2'"),
    (["add", "{p}", "node1", "rack#2", "--reason", "x"], "node name 'rack#2': Slurm node names here are letters"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(project_file, capsys, monkeypatch, argv, message):
    monkeypatch.delenv("CLUSTERTRAIN_DEBUG", raising=False)
    code, out, err = cli(capsys, "nodes", *[a.format(p=project_file) for a in argv])
    assert (code, out) == (2, "") and err.count("\n") == 1 and err.startswith("error: ") and message in err
    assert not suspects_of(project_file).exists()


def test_a_cluster_mount_missing_here_is_refused_not_written_locally(capsys, monkeypatch):
    monkeypatch.delenv("CLUSTERTRAIN_DEBUG", raising=False)
    code, out, err = cli(capsys, "nodes", "add", str(P5E), "gpu-queue-st-p5e-48xlarge-3", "--reason", "x")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "/fsx/checkpoints/p5e-80x7/suspects.jsonl is on the cluster's /fsx/checkpoints, which is not mounted" in err


# -- against a real Slurm cluster ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def slurm3(tmp_path_factory):
    yield from local_slurm_cluster(tmp_path_factory.mktemp("slurm3"), nodes=3)


@pytest.mark.slow
def test_a_suspect_added_by_hand_is_left_out_of_the_next_job(slurm3, project_file, capsys, tmp_path):
    code, _, _ = cli(capsys, "nodes", "add", str(project_file), "node2", "--reason", "rank 1 stuck at step 7")
    assert code == 0
    ex = exclusions(load_project(project_file), slurm3.env(), nodes_needed=2)  # no cluster.partition: the default
    assert ex.exclude == ["node2"] and ex.notes == ["excluding suspect node(s): node2 (manual: rank 1 stuck at step 7)"]
    job = sbatch(slurm3, tmp_path, "srun printenv SLURMD_NODENAME\n", "--nodes=2", "--ntasks-per-node=1",
                 f"--exclude={','.join(ex.exclude)}")
    final = wait_job(slurm3, job)
    assert (final.state, final.nodes) == ("COMPLETED", ("node1", "node3"))


@pytest.mark.slow
def test_replaced_unknown_and_too_many_suspects_against_slurm(slurm3, project_file, tmp_path):
    path = suspects_of(project_file)
    here = socket.gethostname().split(".")[0]  # the local cluster's NodeHostName
    add_suspect(path, "node1", source="hang", reason="stuck", ttl_h=1, host=here, job="7")
    add_suspect(path, "node2", source="rank_lost", reason="gone", ttl_h=1, host="ip-10-0-1-23", job="7")
    add_suspect(path, "node9", source="crash", reason="signal 9", ttl_h=1, job="7")
    project = load_project(project_file)
    ex = exclusions(project, slurm3.env(), nodes_needed=2)
    assert ex.exclude == ["node1"]
    assert [n.split(" ")[2] for n in ex.notes[:2]] == ["node2", "node9"]
    assert f"Slurm runs it on {here} now, not on ip-10-0-1-23" in ex.notes[0]
    assert "node9 is not a node of this Slurm cluster" in ex.notes[1]
    crowded = exclusions(project, slurm3.env(), nodes_needed=3)
    assert crowded.exclude == []
    assert "node1 not excluded: partition debug has 3 nodes, 2 without them" in crowded.notes[-1]
    # why the rules: sbatch refuses the whole job for an unknown name, and for an exclusion that leaves too few nodes
    for options, refusal in ((["--exclude=node9"], "Invalid node name specified"),
                             (["--nodes=3", "--exclude=node1"], "Requested node configuration is not available")):
        proc = subprocess.run(["sbatch", "--parsable", *options, "--wrap", "true"], capture_output=True, text=True,
                              env=client_env(slurm3), cwd=tmp_path, timeout=30)
        assert proc.returncode != 0 and refusal in proc.stderr
