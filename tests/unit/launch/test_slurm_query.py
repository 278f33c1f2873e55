"""Parsers of Slurm output, fed output captured from a real 2-node local cluster (Slurm 22.05.8) by
fixtures/capture_slurm.py: the fixtures' first line says how. Jobs of that run (fixtures/jobs.txt):
ok (2 nodes, exit 0), fail (exit 3), killed (SIGKILL), trap (named ``a b=c``), requeue (requeued
once), pending (Resources, then cancelled), later (BeginTime, then cancelled)."""

from __future__ import annotations

from pathlib import Path

import pytest

from clustertrain.errors import LaunchError
from clustertrain.launch.slurm_query import (
    decode_wait_status,
    expand_hostlist,
    parse_exit_code,
    parse_jobcomp,
    parse_kv_line,
    parse_nodes,
    parse_scontrol_job,
    parse_squeue_json,
)

FIXTURES = Path(__file__).parent / "fixtures"


def load(name: str) -> str:
    text = (FIXTURES / name).read_text()
    assert text.startswith("# captured from a real"), f"{name} lacks its provenance header"
    return text.split("\n", 1)[1]


JOBS = dict(line.split("\t") for line in load("jobs.txt").splitlines())


def by_name(jobs):
    return {j.name: j for j in jobs}


# -- hostlists ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("line", load("hostnames.txt").splitlines())
def test_expand_hostlist_matches_scontrol_show_hostnames(line):
    expr, expanded = line.split("\t")
    assert expand_hostlist(expr) == expanded.split()


def test_expand_hostlist_empty_and_errors():
    assert expand_hostlist("") == []
    with pytest.raises(LaunchError, match="unclosed"):
        expand_hostlist("node[1-2")
    with pytest.raises(LaunchError, match="bad range"):
        expand_hostlist("node[a-b]")


# -- small decoders ----------------------------------------------------------------------------------

def test_decode_wait_status():
    assert decode_wait_status(768) == (3, 0)  # exit 3
    assert decode_wait_status(9) == (0, 9)  # SIGKILL
    assert decode_wait_status(0) == (0, 0)


def test_parse_exit_code():
    assert parse_exit_code("3:0") == (3, 0)
    assert parse_exit_code("0:9") == (0, 9)
    assert parse_exit_code("") == (None, None)


def test_kv_line_keeps_values_with_spaces():
    line = load("scontrol_nodes.txt").splitlines()[0]
    kv = parse_kv_line(line)
    assert kv["OS"].startswith("Linux ") and " " in kv["OS"]
    assert kv["NodeAddr"] == "127.0.0.1"
    assert kv["CoresPerSocket"] == "2"  # followed by two spaces in the real output


# -- squeue --json -----------------------------------------------------------------------------------

def test_squeue_json_while_running():
    jobs = by_name(parse_squeue_json(load("squeue_running.json")))
    ok, fail, killed = jobs["two nodes"], jobs["fail"], jobs["killed"]
    assert (ok.state, ok.exit_code, ok.signal, ok.nodes) == ("COMPLETED", 0, 0, ("node1", "node2"))
    assert (fail.state, fail.exit_code, fail.signal, fail.reason) == ("FAILED", 3, 0, "NonZeroExitCode")
    assert (killed.state, killed.exit_code, killed.signal) == ("FAILED", 0, 9)
    running = jobs["a b=c"]
    assert running.state == "RUNNING" and running.exit_code is None and running.end_time is None
    assert running.start_time is not None and not running.finished
    assert (jobs["pending"].state, jobs["pending"].reason, jobs["pending"].nodes) == ("PENDING", "Resources", ())
    assert jobs["later"].reason == "BeginTime"
    assert ok.job_id == JOBS["ok"] and ok.source == "squeue"
    assert ok.start_time <= ok.end_time


def test_squeue_json_after_the_end():
    jobs = by_name(parse_squeue_json(load("squeue_done.json")))
    assert jobs["requeue"].state == "COMPLETED" and jobs["requeue"].restarts == 1
    assert jobs["a b=c"].state == "COMPLETED" and jobs["a b=c"].exit_code == 0
    assert jobs["pending"].state == "CANCELLED" and jobs["pending"].finished


def test_squeue_json_rejects_other_text():
    with pytest.raises(LaunchError, match="squeue --json"):
        parse_squeue_json("JobId=1 JobName=x")


# -- scontrol show job -o ----------------------------------------------------------------------------

@pytest.mark.parametrize("phase", ["running", "done"])
def test_scontrol_agrees_with_squeue_json(phase):
    lines = load(f"scontrol_jobs_{phase}.txt").splitlines()
    from_json = {j.job_id: j for j in parse_squeue_json(load(f"squeue_{phase}.json"))}
    assert len(lines) == len(JOBS)
    for line in lines:
        job = parse_scontrol_job(line)
        ref = from_json[job.job_id]
        assert (job.name, job.state, job.exit_code, job.signal, job.nodes, job.restarts, job.reason) == (
            ref.name, ref.state, ref.exit_code, ref.signal, ref.nodes, ref.restarts, ref.reason)
        assert job.source == "scontrol"


def test_scontrol_name_with_space_and_equals():
    job = next(parse_scontrol_job(line) for line in load("scontrol_jobs_done.txt").splitlines()
               if f"JobId={JOBS['trap']} " in line)
    assert job.name == "a b=c"
    assert job.start_time is not None and job.end_time >= job.start_time


def test_scontrol_rejects_other_text():
    with pytest.raises(LaunchError, match="no JobId"):
        parse_scontrol_job("slurm_load_jobs error: Invalid job id specified")


# -- jobcomp/filetxt ---------------------------------------------------------------------------------

def test_jobcomp_final_states():
    final = parse_jobcomp(load("jobcomp.txt"))
    assert set(final) == set(JOBS.values())
    assert (final[JOBS["fail"]].state, final[JOBS["fail"]].exit_code) == ("FAILED", 3)
    assert final[JOBS["killed"]].signal == 9
    assert final[JOBS["ok"]].nodes == ("node1", "node2") and final[JOBS["ok"]].name == "two nodes"
    requeued = final[JOBS["requeue"]]  # one PENDING record for the requeue, then the final one
    assert (requeued.state, requeued.restarts) == ("COMPLETED", 1)
    assert final[JOBS["later"]].state == "CANCELLED" and final[JOBS["later"]].nodes == ()
    assert final[JOBS["trap"]].name == "a b=c"


def test_jobcomp_agrees_with_scontrol_times():
    final = parse_jobcomp(load("jobcomp.txt"))
    for line in load("scontrol_jobs_done.txt").splitlines():
        job = parse_scontrol_job(line)
        if job.state in ("COMPLETED", "FAILED"):
            rec = final[job.job_id]
            assert (rec.state, rec.exit_code, rec.start_time, rec.end_time) == (
                job.state, job.exit_code, job.start_time, job.end_time)


# -- scontrol show node -o ---------------------------------------------------------------------------

def test_parse_nodes():
    nodes = parse_nodes(load("scontrol_nodes.txt"))
    assert [n.name for n in nodes] == ["node1", "node2"]
    assert all(n.addr == "127.0.0.1" and n.state == "IDLE" and n.cpus == 2 for n in nodes)
    assert nodes[0].gres == "" and nodes[0].flags == ()


def test_parse_drained_node():
    node1, node2 = parse_nodes(load("scontrol_nodes_drained.txt"))
    assert (node1.state, node1.flags) == ("IDLE", ())
    assert (node2.state, node2.flags) == ("IDLE", ("DRAIN",))
    assert node2.reason.startswith("bad gpu 3 [root@")
