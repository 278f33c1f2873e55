"""`clustertrain validate suite` for real on the local Slurm cluster (2 emulated nodes, CPU/gloo): a full
run with a report, a rank that never joins (failed verdict within its timeout), a hung job cancelled at
its per-job limit."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clustertrain.launch.slurm_query import query_job
from clustertrain.resolve import load_project
from clustertrain.validate import CollectivesConfig
from clustertrain.validate.storagebench import StorageBenchConfig
from clustertrain.validate.suite import SuiteConfig, SuiteReport, run_suite
from tests.support.slurm import client_env, local_slurm_cluster

pytestmark = pytest.mark.slow

PROJECT = """
name: vs
cluster: {{backend: slurm, nodes: 2, gpus_per_node: 0, procs_per_node: 1}}
storage: {{root: {root}}}
launch: {{exclusive: false}}
models:
  - name: tiny
    model: {{layers: 2, hidden: 64, heads: 4, seq_len: 64}}
    training: {{max_steps: 2, micro_batch: 4, global_batch: 8}}
"""
TINY = ["--max-bytes", "64K", "--iters", "2", "--warmup", "1", "--storage-size", "4M", "--storage-files", "100"]
DEFAULT_SWEEP = ["--iters", "2", "--warmup", "1", "--storage-size", "4M", "--storage-files", "100"]  # default --max-bytes


@pytest.fixture(scope="module")
def local_slurm(tmp_path_factory):
    yield from local_slurm_cluster(tmp_path_factory.mktemp("slurm"), nodes=2)


def project_file(tmp_path: Path, root: Path) -> Path:
    path = tmp_path / "vs.yaml"
    path.write_text(PROJECT.format(root=json.dumps(str(root))))
    return path


def suite_cli(cluster, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clustertrain", "validate", "suite", *args], capture_output=True,
                          text=True, env=client_env(cluster), timeout=timeout)


def verdicts(report: dict, job: str) -> dict[str, str]:
    return {r["check"]: r["verdict"] for r in report["rows"] if r["job"] == job}


def test_suite_on_two_nodes_passes_with_a_report(local_slurm, tmp_path):
    root = tmp_path / "st 'o\"r#e%x"  # hostile storage root: blanks, quotes, '#', Slurm's '%'
    proc = suite_cli(local_slurm, str(project_file(tmp_path, root)), "--nodes", "2", "--json", "--timeout", "90",
                     "--op-timeout", "20", *DEFAULT_SWEEP)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    report = json.loads(proc.stdout)
    [written] = list((root / "vs" / "validation").glob("*/report.json"))  # the layout's outputs base
    assert json.loads(written.read_text()) == report and report["directory"] == str(written.parent)
    # each check's config went to its job as a file that the job's step read (--config)
    assert json.loads((written.parent / "config" / "collectives.json").read_text())["backend"] == "gloo"
    assert json.loads((written.parent / "config" / "storage.json").read_text())["size_mib"] == 4
    assert report["failed"] is False and report["thresholds"] == "cpu" and report["nodes"] == 2
    assert [j["name"] for j in report["jobs"]] == ["smoke", "gpu-efa", "collectives", "nccl-tests", "storage-1"]
    smoke = verdicts(report, "smoke")
    assert smoke["nodes"] == "pass" and "fail" not in smoke.values()
    # the interpreter step ran on both nodes (a CPU project without an image: this interpreter, on the hosts)
    [py] = [r for r in report["rows"] if r["check"] == "interpreter"]
    assert py["verdict"] == "pass" and py["found"].startswith(f"{sys.executable} (Python ")
    nodes_row = next(r for r in report["rows"] if r["check"] == "nodes")
    assert nodes_row["found"].startswith("2/2: node1 ") and ", node2 " in nodes_row["found"]
    assert {smoke[c] for c in ("gpu", "cuda_driver", "efa", "efa_installer")} == {"not-applicable"}
    assert verdicts(report, "gpu-efa") == verdicts(report, "nccl-tests") == {"job": "not-applicable"}
    coll = verdicts(report, "collectives")
    # the defaults give a bandwidth and a transport verdict (not-applicable on CPU/gloo, each with its reason)
    assert coll == {"job": "pass", "ranks": "pass", **{f"{op} correctness": "pass" for op in
                    ("all_reduce", "all_gather", "broadcast", "reduce", "reduce_scatter", "alltoall")},
                    "busbw": "not-applicable", "transport": "not-applicable"}
    [ar] = [r for r in report["rows"] if r["check"] == "all_reduce correctness"]
    assert ar["found"] == "18 size(s), 0 wrong"  # 8 B .. 1 MiB: the CPU default sweep
    storage = verdicts(report, "storage-1")
    assert storage[f"write {root}"] == storage[f"read {root}"] == storage[f"metadata {root}"] == "pass"
    [read] = [r for r in report["rows"] if r["check"] == f"read {root}"]
    assert read["detail"].endswith("page cache: direct")
    assert all(j["state"] != "TIMEOUT" for j in report["jobs"])
    for job in [j for j in report["jobs"] if j["state"] != "SKIPPED"]:
        assert Path(job["script"]).read_text().startswith("#!/bin/bash\n# Generated by clustertrain")
        assert Path(job["output"]).exists(), job
    assert not list(tmp_path.rglob("INJECTED"))

    table = suite_cli(local_slurm, str(project_file(tmp_path, root)), "--nodes", "3", *TINY)
    assert table.returncode == 2 and "has only 2 node(s)" in table.stderr


def test_rank_that_never_joins_fails_collectives_within_its_timeout(local_slurm, tmp_path):
    started = time.monotonic()
    proc = suite_cli(local_slurm, str(project_file(tmp_path, tmp_path / "fsx")), "--json", "--timeout", "60",
                     "--op-timeout", "8", "--inject-fault", "absent:1", *TINY)
    elapsed = time.monotonic() - started
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr
    report = json.loads(proc.stdout)
    [run_row] = [r for r in report["rows"] if r["job"] == "collectives" and r["check"] == "run"]
    assert run_row["verdict"] == "fail" and run_row["found"] == "rank(s) 1 never joined within 8s"
    [job] = [j for j in report["jobs"] if j["name"] == "collectives"]
    assert job["state"] == "FAILED" and job["elapsed_s"] < 60 and elapsed < 60
    assert [r["check"] for r in report["rows"] if r["verdict"] == "fail"] == ["run"]  # nothing else failed


def test_hung_collectives_job_is_cancelled_at_its_limit(local_slurm, tmp_path):
    project = load_project(project_file(tmp_path, tmp_path / "fsx"))
    cfg = SuiteConfig(nodes=2, job_timeout_s=12, start_timeout_s=60,
                      collectives=CollectivesConfig(ops=["all_reduce"], max_bytes=64, iters=1, warmup=0,
                                                    timeout_s=300, fault="hang:1:all_reduce"),
                      storage=StorageBenchConfig(size_mib=1, files=10))
    started = time.monotonic()
    report = run_suite(project, cfg, local_slurm.env())
    assert time.monotonic() - started < 45
    assert report.failed and SuiteReport.model_validate_json(Path(report.directory, "report.json").read_text()) == report
    [job] = [j for j in report.jobs if j.name == "collectives"]
    assert job.state == "TIMEOUT"
    [row] = [r for r in report.rows if r.job == "collectives"]
    assert (row.check, row.verdict, row.found) == ("job", "fail", "still running after 12s; cancelled")
    deadline = time.monotonic() + 15
    while query_job(job.job_id, local_slurm.env()).state != "CANCELLED" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert query_job(job.job_id, local_slurm.env()).state == "CANCELLED"
