"""Rendezvous ports of jobs that share a node (issue 42): co-located jobs never meet on one port.

The batch script's bash lines and :func:`clustertrain.core.ranks.shared_node_port` are the same rule (run here in a
real bash); whole-node jobs keep the job-id rule (their golden scripts are unchanged)."""

from __future__ import annotations

import itertools
import subprocess
from pathlib import Path

from clustertrain.core.ranks import PORT_BASE, PORT_SPAN, batch_lines, port_for_job, shared_node_port


def bash_port(lines: list[str], env: dict[str, str]) -> int:
    """MASTER_PORT after the rank-wiring lines that set it (the scontrol lines need a cluster and are left out)."""
    script = "\n".join(line for line in lines if "PORT" in line or "first_gpu" in line) + '\necho "$MASTER_PORT"\n'
    out = subprocess.run(["bash", "-c", script], env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True,
                         check=True)
    return int(out.stdout.strip())


def test_jobs_on_one_node_never_share_a_port_whatever_their_ids():
    # ids that collide under the job-id rule (10000 apart) and under the shared rule's id part (625 apart)
    ids = [7, 10007, 20007, 632, 1257, 99999, 123456789]
    assert port_for_job(7) == port_for_job(10007)  # why the shared rule exists
    splits = [(0, 4), (0, 2, 4, 6), (0, 3, 5), (1, 7)]  # first GPUs of jobs packed on one 8-GPU node
    for firsts in splits:
        for combo in itertools.product(ids, repeat=len(firsts)):
            ports = [shared_node_port(j, g) for j, g in zip(combo, firsts)]
            assert len(set(ports)) == len(ports), (combo, firsts, ports)
            assert all(PORT_BASE <= p < PORT_BASE + PORT_SPAN for p in ports)


def test_the_batch_script_computes_the_same_port():
    lines = batch_lines(shared_node=True)
    for job, gpus, first in (("10007", "4,5,6,7", 4), ("7", "0,1", 0), ("99999", "6", 6)):
        assert bash_port(lines, {"SLURM_JOB_ID": job, "SLURM_JOB_GPUS": gpus}) == shared_node_port(job, first)
    # a share of CPU workers (no SLURM_JOB_GPUS) keeps the job-id rule; whole-node jobs never run the extra lines
    assert bash_port(lines, {"SLURM_JOB_ID": "10007"}) == port_for_job(10007)
    assert bash_port(batch_lines(), {"SLURM_JOB_ID": "10007", "SLURM_JOB_GPUS": "4"}) == port_for_job(10007)
    assert batch_lines() == batch_lines(shared_node=True)[:len(batch_lines())]


def test_ports_a_rank_binds_itself_come_from_the_ephemeral_range_above_the_rule():
    from clustertrain.train.checkpoint_async import _free_port

    low, _high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    assert low >= PORT_BASE + PORT_SPAN  # Linux default 32768: bind(0) never hands out 20000-29999
    ports = {_free_port() for _ in range(20)}
    assert all(p >= low for p in ports)


def test_shared_node_script_carries_the_rule(tmp_path):
    from tests.unit.launch.test_sbatch import shared_project

    from clustertrain.launch.sbatch import build_request, render_script

    p = shared_project()
    text = render_script(build_request(p, p.model("half"), tmp_path / "half", python="/opt/venv/bin/python"))
    assert 'first_gpu="${SLURM_JOB_GPUS:-}"' in text
    whole = render_script(build_request(p, p.model("whole"), tmp_path / "whole", python="/opt/venv/bin/python"))
    assert "SLURM_JOB_GPUS" not in whole
