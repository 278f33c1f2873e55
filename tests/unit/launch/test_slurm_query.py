"""Parsers of Slurm output, fed output captured from a real 2-node local cluster (Slurm 22.05.8) by
fixtures/capture_slurm.py: the fixtures' first line says how. Jobs of that run (fixtures/jobs.txt):
ok (2 nodes, exit 0), fail (exit 3), killed (SIGKILL), trap (named ``a b=c``), requeue (requeued
once), pending (Resources, then cancelled), later (BeginTime, then cancelled).

Newer releases (ParallelCluster 3.6-3.8 ship Slurm 23.02, 3.9-3.10 23.11, 3.12-3.13 24.05, 3.16 25.11: its
CHANGELOG) have no captured sample here: fixtures/squeue_23.02.json, squeue_23.11.json, squeue_24.05.json and
sacct_24.05.txt are written by hand in the shapes SchedMD's sources document (their first line names the tag
and files; read from github.com/SchedMD/slurm): the data_parser plugins v0.0.39 (23.02), v0.0.40 (23.11),
v0.0.41 (24.05) ``parsers.c`` (JOB_INFO, PROCESS_EXIT_CODE, UINT32/UINT64_NO_VAL, TIMESTAMP_NO_VAL, the
JOB_STATE flag array), ``doc/html/rest_api.shtml`` of each tag, and ``src/sacct/print.c``. v0.0.42-v0.0.44
(24.11, 25.05, 25.11) keep v0.0.41's shapes for these fields."""

from __future__ import annotations

import subprocess
from datetime import datetime
from pathlib import Path

import pytest

from clustertrain.core.errors import LaunchError
from clustertrain.launch import slurmcli
from clustertrain.launch.slurm_query import (
    JobGone,
    decode_wait_status,
    json_exit_code,
    json_job_state,
    json_number,
    parse_exit_code,
    parse_jobcomp,
    parse_kv_line,
    parse_nodes,
    parse_sacct,
    parse_scontrol_job,
    parse_squeue_json,
    query_job,
)

FIXTURES = Path(__file__).parent / "fixtures"


def load(name: str) -> str:
    text = (FIXTURES / name).read_text()
    assert text.startswith("# captured from a real"), f"{name} lacks its provenance header"
    return text.split("\n", 1)[1]


def made(name: str) -> str:
    """A fixture written by hand in a documented format (no cluster of that release to capture from)."""
    text = (FIXTURES / name).read_text()
    assert text.startswith("# made by hand (not captured"), f"{name} lacks its provenance header"
    return text.split("\n", 1)[1]


JOBS = dict(line.split("\t") for line in load("jobs.txt").splitlines())


def by_name(jobs):
    return {j.name: j for j in jobs}


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


def test_squeue_json_rejects_json_without_jobs_and_says_why():
    with pytest.raises(LaunchError, match="Unable to contact slurm controller"):
        parse_squeue_json('{"errors": [{"description": "Unable to contact slurm controller", "error_number": 1}]}')


# squeue --json of 23.02 (exit_code an object), 23.11 and 24.05 (times, exit codes, job_state list): every job
# of the hand-made fixtures -> (state, exit code, signal, nodes, restarts, reason, finished); 22.05's values for
# the same jobs are in the tests above.
NEW_JSON = {
    "two nodes": ("COMPLETED", 0, 0, ("node1", "node2"), 0, None, True),
    "fail": ("FAILED", 3, 0, ("node1",), 0, "NonZeroExitCode", True),
    "killed": ("FAILED", 0, 9, ("node2",), 0, "JobLaunchFailure", True),
    "a b=c": ("RUNNING", None, None, ("node1",), 0, None, False),
    "requeue": ("COMPLETED", 0, 0, ("node1",), 1, None, True),
    "pending": ("PENDING", None, None, (), 0, "Resources", False),
    "later": ("CANCELLED", 0, 0, (), 0, "BeginTime", True),
    "epilog": ("COMPLETING", None, None, ("node2",), 0, None, False),  # what scontrol prints, not the base state
    "timeout": ("TIMEOUT", 0, 15, ("node1", "node2"), 0, "TimeLimit", True),
}
EPOCH = {"23.02": 1700000000, "23.11": 1715000000, "24.05": 1735000000}


@pytest.mark.parametrize("release", ["23.02", "23.11", "24.05"])
def test_squeue_json_of_newer_slurm(release):
    jobs = by_name(parse_squeue_json(made(f"squeue_{release}.json")))
    assert {name: (j.state, j.exit_code, j.signal, j.nodes, j.restarts, j.reason, j.finished)
            for name, j in jobs.items()} == NEW_JSON
    t0 = EPOCH[release]
    ok, running, pending = jobs["two nodes"], jobs["a b=c"], jobs["pending"]
    assert (ok.start_time, ok.end_time) == (datetime.fromtimestamp(t0 + 2), datetime.fromtimestamp(t0 + 2))
    assert running.start_time == datetime.fromtimestamp(t0 + 3) and running.end_time is None  # end = expected
    assert pending.start_time == datetime.fromtimestamp(t0 + 31536003)  # the expected start
    assert ok.job_id == "1" and ok.source == "squeue"


def test_json_number_in_every_shape():
    assert json_number(5) == 5 and json_number(None) is None  # 22.05; +complex: null = unset
    assert json_number("Infinity") is None  # +complex
    assert json_number({"set": True, "infinite": False, "number": 7}) == 7
    assert json_number({"set": False, "infinite": False, "number": 0}) is None
    assert json_number({"set": False, "infinite": True, "number": 0}) is None
    assert json_number(True) is None


def test_json_exit_code_in_every_shape():
    unset = {"set": False, "infinite": False, "number": 0}
    assert json_exit_code(768) == (3, 0)  # 22.05 raw wait status
    assert json_exit_code({"set": True, "infinite": False, "number": 9}) == (0, 9)  # 23.02
    assert json_exit_code(unset) == (None, None)
    assert json_exit_code({"status": ["ERROR"], "return_code": {"set": True, "infinite": False, "number": 3},
                           "signal": {"id": unset, "name": ""}}) == (3, 0)  # 23.11+
    assert json_exit_code({"status": ["SIGNALED"], "return_code": unset,
                           "signal": {"id": {"set": True, "infinite": False, "number": 9}, "name": "KILL"}}) == (0, 9)
    assert json_exit_code({"status": ["PENDING"], "return_code": unset, "signal": {"id": unset, "name": ""}}) == (
        None, None)
    assert json_exit_code({"status": ["SIGNALED"], "return_code": None, "signal": {"id": 9, "name": "KILL"}}) == (
        0, 9)  # +complex


def test_json_job_state_list_reads_as_scontrol_prints_it():
    assert json_job_state("RUNNING") == "RUNNING"
    assert json_job_state(["RUNNING"]) == "RUNNING"
    assert json_job_state(["COMPLETED", "COMPLETING"]) == "COMPLETING"
    assert json_job_state(["PENDING", "REQUEUED"]) == "REQUEUED"
    assert json_job_state(["RUNNING", "UPDATE_DB"]) == "RUNNING"  # a flag job_state_string() does not print
    assert json_job_state([]) == "" and json_job_state(None) == ""


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


# -- sacct and query_job's fallbacks ------------------------------------------------------------------

def test_parse_sacct():
    final = parse_sacct(made("sacct_24.05.txt"))
    assert {k: (j.state, j.exit_code, j.signal, j.nodes, j.restarts, j.reason) for k, j in final.items()} == {
        "1": ("COMPLETED", 0, 0, ("node1", "node2"), 0, None),
        "2": ("FAILED", 3, 0, ("node1",), 0, "NonZeroExitCode"),
        "3": ("FAILED", 0, 9, ("node2",), 0, "JobLaunchFailure"),
        "4": ("COMPLETED", 0, 0, ("node1",), 0, None),
        "5": ("COMPLETED", 0, 0, ("node1",), 1, None),
        "6": ("CANCELLED", 0, 0, (), 0, "Resources"),  # "CANCELLED by 1000", "None assigned"
        "8": ("FAILED", 1, 0, ("node1",), 2, "NonZeroExitCode"),  # the older job 8 is not a restart
        "9": ("RUNNING", None, None, ("node1", "node2"), 0, None),
    }
    assert final["4"].name == "a|b=c" and final["8"].name == "new" and final["1"].source == "sacct"
    assert (final["2"].start_time, final["2"].end_time) == (
        datetime(2024, 12, 24, 1, 20, 2), datetime(2024, 12, 24, 1, 20, 3))
    assert final["5"].start_time == datetime(2024, 12, 24, 1, 20, 7)
    assert final["9"].end_time is None


CONFIG = """Configuration data as of 2024-12-24T01:00:00
AccountingStorageType   = {acct}
JobCompLoc              = (null)
JobCompType             = jobcomp/none
MinJobAge               = 300 sec
"""


def fake_slurm(monkeypatch, *, acct: str, sacct_out: str = "", sacct_rc: int = 0, sacct_err: str = ""):
    """Stand in for the Slurm client commands: scontrol has forgotten every job; returns the argv/env seen."""
    calls = []

    def run(argv, capture_output, text, env, timeout):
        calls.append((argv, env))
        if argv[:3] == ["scontrol", "show", "job"]:
            return subprocess.CompletedProcess(argv, 1, "", "slurm_load_jobs error: Invalid job id specified\n")
        if argv[:3] == ["scontrol", "show", "config"]:
            return subprocess.CompletedProcess(argv, 0, CONFIG.format(acct=acct), "")
        if argv[0] == "sacct":
            return subprocess.CompletedProcess(argv, sacct_rc, sacct_out, sacct_err)
        raise AssertionError(f"unexpected command {argv}")

    monkeypatch.setattr(slurmcli.subprocess, "run", run)
    return calls


def test_query_job_asks_sacct_after_the_controller_forgot_where_accounting_exists(monkeypatch):
    calls = fake_slurm(monkeypatch, acct="accounting_storage/slurmdbd", sacct_out=made("sacct_24.05.txt"))
    monkeypatch.setenv("SLURM_TIME_FORMAT", "relative")
    job = query_job("8", {"SLURM_CONF": "/opt/slurm/etc/slurm.conf"})
    assert (job.source, job.state, job.exit_code, job.restarts, job.name) == ("sacct", "FAILED", 1, 2, "new")
    argv, env = calls[-1]
    assert argv == ["sacct", "-j", "8", "-X", "-D", "-n", "-P", "-o",
                    "JobID,State,ExitCode,Start,End,NodeList,Reason,JobName"]
    # times are parsed as ISO-8601: a user's SLURM_TIME_FORMAT=relative must not reach the clients
    assert all(e["SLURM_TIME_FORMAT"] == "standard" for _, e in calls)
    assert env["SLURM_CONF"] == "/opt/slurm/etc/slurm.conf"
    # ParallelCluster without Scheduling/SlurmSettings/Database: no sacct call, JobGone (the run dir answers)
    calls = fake_slurm(monkeypatch, acct="accounting_storage/none")
    with pytest.raises(JobGone, match="unknown to the controller"):
        query_job("8")
    assert not any(argv[0] == "sacct" for argv, _ in calls)


@pytest.mark.parametrize(("rc", "err", "why"), [(0, "", "has no record of it"),
                                                (1, "sacct: error: Problem talking to the database", "sacct failed")])
def test_query_job_without_a_sacct_record_is_gone_and_says_why(monkeypatch, rc, err, why):
    fake_slurm(monkeypatch, acct="accounting_storage/slurmdbd", sacct_rc=rc, sacct_err=err)
    with pytest.raises(JobGone, match=why):
        query_job("77")


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
