"""clustertrain.core.ranks: Slurm hostlists, the rendezvous port rule, Slurm/torchrun variables -> RankInfo.
That training, validation and the batch script agree on one environment is tested on the rendered
script in tests/unit/launch/test_sbatch.py (test_train_validate_and_the_batch_script_agree_on_the_ranks)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from clustertrain.core.errors import ClusterTrainError
from clustertrain.core.ranks import (
    PORT_BASE,
    PORT_SPAN,
    RankError,
    RankInfo,
    batch_lines,
    detect_ranks,
    expand_hostlist,
    first_host,
    port_for_job,
)

CAPTURED = Path(__file__).parents[1] / "launch" / "fixtures" / "hostnames.txt"


def captured_hostlists() -> list[str]:
    text = CAPTURED.read_text()
    assert text.startswith("# captured from a real"), "hostnames.txt lacks its provenance header"
    return text.split("\n", 1)[1].splitlines()


# -- hostlists ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("line", captured_hostlists())
def test_expand_hostlist_matches_scontrol_show_hostnames(line):
    expr, expanded = line.split("\t")
    assert expand_hostlist(expr) == expanded.split()


@pytest.mark.parametrize("expr,hosts", [
    ("node[01-03,7],other", ["node01", "node02", "node03", "node7", "other"]),  # each range has its own width
    ("queue1-dy-p5-[10-12]", ["queue1-dy-p5-10", "queue1-dy-p5-11", "queue1-dy-p5-12"]),
    ("r[1-2]n[8-9]x", ["r1n8x", "r1n9x", "r2n8x", "r2n9x"]),
    ("gpu-[098-101]", ["gpu-098", "gpu-099", "gpu-100", "gpu-101"]),
    (" a,b ", ["a", "b"]),
    ("", []),
])
def test_expand_hostlist_forms(expr, hosts):
    assert expand_hostlist(expr) == hosts


@pytest.mark.parametrize("expr,why", [
    ("node[1-2", "unclosed"), ("node[a-b]", "bad range 'a-b'"), ("node[3-1]", "bad range '3-1'"),
    ("node]1[", "unbalanced"), ("node[[1]]", "unbalanced"), ("node[]", "bad range ''"), ("n[1-]", "bad range '1-'"),
])
def test_malformed_hostlists_are_one_line_errors(expr, why):
    with pytest.raises(RankError, match=why) as err:
        expand_hostlist(expr)
    assert isinstance(err.value, ClusterTrainError) and "\n" not in str(err.value)
    assert repr(expr) in str(err.value)


def test_first_host():
    assert first_host("p5-st-[03-04],x") == "p5-st-03"
    assert first_host("") is None


# -- the port rule -----------------------------------------------------------------------------------

def test_port_rule_stays_between_privileged_and_ephemeral_ports():
    assert (PORT_BASE, PORT_SPAN) == (20000, 10000)
    assert port_for_job("31337") == port_for_job(31337) == 21337
    ports = {port_for_job(j) for j in range(0, 200_000, 7)}
    low, _high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    assert min(ports) == 20000 and max(ports) == 29999 and max(ports) < min(low, 32768)


@pytest.mark.parametrize("job_id", ["", "12_3", "abc", "-5"])
def test_job_id_that_is_not_a_number_is_refused(job_id):
    with pytest.raises(RankError, match="SLURM_JOB_ID"):
        port_for_job(job_id)


def test_batch_lines_compute_the_same_port_in_bash():
    """The shell arithmetic the batch script runs gives port_for_job's answer."""
    port_line = [ln for ln in batch_lines() if "MASTER_PORT" in ln]
    assert len(port_line) == 1
    for job_id in ("1", "9999", "10000", "31337", "4294967"):
        out = subprocess.run(["bash", "-c", f"{port_line[0]}; echo $MASTER_PORT"], env={"SLURM_JOB_ID": job_id},
                             capture_output=True, text=True, check=True).stdout
        assert int(out) == port_for_job(job_id)


# -- environments -> RankInfo ------------------------------------------------------------------------

SLURM = {"SLURM_PROCID": "13", "SLURM_NTASKS": "20", "SLURM_LOCALID": "1", "SLURM_NODEID": "3",
         "SLURM_TASKS_PER_NODE": "6(x3),2", "SLURM_JOB_ID": "777", "SLURM_JOB_NODELIST": "a[1-4]"}


def test_slurm_variables():
    info = detect_ranks(SLURM)
    assert info == RankInfo(rank=13, world_size=20, local_rank=1, local_world_size=2, node_rank=3, master_addr="a1",
                            master_port=20777, source="slurm")
    step = detect_ranks({**SLURM, "SLURM_STEP_NODELIST": "a[3-4]"})  # srun puts rank 0 on the step's first node
    assert step.master_addr == "a3"
    given = detect_ranks({**SLURM, "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "23456"})
    assert (given.master_addr, given.master_port) == ("10.1.2.3", 23456)
    assert detect_ranks({**SLURM, "SLURM_TASKS_PER_NODE": "", "SLURM_NTASKS_PER_NODE": "5"}).local_world_size == 5


def test_torchrun_variables_win_and_round_trip_through_environ():
    info = RankInfo(rank=3, world_size=8, local_rank=1, local_world_size=2, node_rank=1, master_addr="h0",
                    master_port=29400, source="torchrun")
    assert detect_ranks({**SLURM, **info.environ()}) == info
    bare = detect_ranks({"RANK": "2", "WORLD_SIZE": "4"})
    assert (bare.local_rank, bare.local_world_size, bare.master_addr, bare.master_port) == (2, 4, "127.0.0.1", 29500)


def test_outside_a_job():
    assert detect_ranks({"SLURM_JOB_ID": "5", "PATH": "/bin"}) is None  # an salloc shell is not a rank
    assert RankInfo.from_environ({"MASTER_PORT": "2345"}).master_port == 2345


@pytest.mark.parametrize("env,why", [
    ({"RANK": "4", "WORLD_SIZE": "4"}, "rank 4 is outside world size 4"),
    ({"RANK": "1", "WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not an integer"),
    ({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "2"}, "local rank 3 is outside"),
    ({**SLURM, "SLURM_TASKS_PER_NODE": "6x3"}, "SLURM_TASKS_PER_NODE='6x3'"),
    ({**SLURM, "SLURM_JOB_NODELIST": "a[1-"}, "unclosed"),
    ({**SLURM, "MASTER_PORT": "70000"}, "not a TCP port"),
])
def test_bad_variables_are_one_line_errors(env, why):
    with pytest.raises(RankError, match=why) as err:
        detect_ranks(env)
    assert "\n" not in str(err.value)
