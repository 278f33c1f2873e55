"""Collectives over real gloo processes on 127.0.0.1 (2 ranks), with injected faults."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from clustertrain.launch.local_ranks import free_port
from clustertrain.validate import ALL_OPS, CollectiveRun, CollectivesConfig, run_collectives
from clustertrain.validate.collectives import local_budget_s

pytestmark = pytest.mark.slow
SMALL = dict(min_bytes=8, max_bytes=1 << 20, factor=16, iters=2, warmup=1, nproc=2)


def test_all_six_ops_verified_on_two_gloo_ranks():
    run = run_collectives(CollectivesConfig(timeout_s=20, **SMALL))
    assert not run.failed, run.problems
    assert run.backend == "gloo" and run.world_size == 2
    assert [r.op for r in run.reports] == list(ALL_OPS)
    for rep in run.reports:
        assert [r.size_bytes for r in rep.rows][:2] == [8, 128] and rep.rows[-1].size_bytes == 8 * 16**4  # <= 1 MiB
        for row in rep.rows:
            assert row.wrong == 0 and row.time_us > 0
            factor = {"all_reduce": 1.0, "broadcast": 1.0, "reduce": 1.0}.get(rep.op, 0.5)  # n=2
            assert row.busbw_gbps == pytest.approx(row.algbw_gbps * factor)


def test_corrupted_rank_gives_wrong_counts():
    run = run_collectives(CollectivesConfig(timeout_s=20, ops=["all_gather", "all_reduce"], fault="corrupt:1:all_gather",
                                            **SMALL))
    ag, ar = run.reports
    assert run.failed and ag.failed and not ar.failed
    assert all(r.wrong and r.wrong > 0 for r in ag.rows)  # every size detected
    assert all(r.wrong == 0 for r in ar.rows)


def run_cli(*args: str, timeout: float) -> CollectiveRun:
    """``clustertrain validate collectives --json ARGS`` on local ranks, killed after ``timeout`` seconds: a hang
    fails the test through the timeout instead of a measured wall-clock time (which flakes on shared cores)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k not in ("RANK", "WORLD_SIZE")}
    cmd = [sys.executable, "-c", "from clustertrain.cli.validate import app; app()", "collectives", "--json",
           "--min-bytes", "8", "--max-bytes", "1M", "--factor", "16", "--iters", "2", "--warmup", "1", "--nproc", "2",
           *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode in (0, 1), proc.stderr[-1000:]
    return CollectiveRun.model_validate_json(proc.stdout)


def test_hung_rank_becomes_a_failed_verdict_within_timeout():
    spec = CollectivesConfig(timeout_s=3, ops=["all_reduce", "broadcast", "alltoall"], **SMALL)
    run = run_cli("--timeout", "3", "--ops", "all_reduce,broadcast,alltoall", "--fault", "hang:1:broadcast",
                  timeout=local_budget_s(spec) + 60)
    assert run.failed and not run.reports[0].failed
    assert run.reports[1].failed and "timed out" in run.reports[1].rows[-1].error
    assert run.reports[2].failed and "skipped" in run.reports[2].problems[0]


def test_rank_that_never_joins_fails_not_hangs():
    spec = CollectivesConfig(timeout_s=3, ops=["all_reduce"], **SMALL)
    run = run_cli("--timeout", "3", "--ops", "all_reduce", "--fault", "absent:1", timeout=local_budget_s(spec) + 60)
    assert run.failed and any("rank(s) 1 never joined" in p for p in run.problems)


def test_cli_under_torchrun_style_env_and_csv(tmp_path):
    """The CLI as a Slurm/torchrun step would run it: every rank is a process with RANK/WORLD_SIZE set."""
    port = str(free_port())
    csv_path = tmp_path / "out.csv"
    cmd = [sys.executable, "-c", "from clustertrain.cli.validate import app; app()", "collectives", "--ops",
           "all_reduce,reduce_scatter", "--min-bytes", "1K", "--max-bytes", "4K", "--iters", "2", "--warmup", "1",
           "--timeout", "20", "--json", "--csv", str(csv_path)]
    procs = [subprocess.Popen(cmd, env=dict(os.environ, SLURM_PROCID=str(r), SLURM_NTASKS="2", SLURM_LOCALID=str(r),
                                            MASTER_ADDR="127.0.0.1", MASTER_PORT=port),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    outs = [p.communicate(timeout=90) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-500:]
    import json

    data = json.loads(outs[0][0])
    assert data["world_size"] == 2 and [r["op"] for r in data["reports"]] == ["all_reduce", "reduce_scatter"]
    assert outs[1][0] == ""  # only rank 0 prints
    lines = csv_path.read_text().splitlines()
    assert lines[0].startswith("op,nranks,size_bytes") and len(lines) == 1 + 2 * 3
