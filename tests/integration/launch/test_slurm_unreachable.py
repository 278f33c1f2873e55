"""No Slurm controller answers: `submit`, `logs`, `cancel`, `validate suite` and `image check` on a
``backend: slurm`` project refuse in one line naming SLURM_CONF (or its absence), the controller and the fix,
exit 2, before writing anything; `status` says so in one line and still shows what the run directory says.

Two situations, both real: SLURM_CONF names a slurm.conf whose controller port nothing listens on, and no
SLURM_CONF at all (this machine has no /etc/slurm/slurm.conf, so the client finds no configuration)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from clustertrain.cli import app
from clustertrain.core.job_records import JobRecord, add_record
from clustertrain.core.run_paths import RunPaths
from clustertrain.core.run_records import RunStatus, write_status_record
from clustertrain.core.states import State
from clustertrain.launch.slurm_cluster_procs import free_ports
from clustertrain.launch.slurmcli import LOCAL_ENV_FIX, slurm_unreachable
from tests.support.files import snapshot

PROJECT = """name: unreach
cluster: {backend: slurm, nodes: 2, gpus_per_node: 0, procs_per_node: 1, threads_per_worker: 1}
storage: {root: runs}
models:
  - name: tiny
    model: {layers: 2, hidden: 64, heads: 4, seq_len: 32}
    data: {source: "builtin:shakespeare", tokenizer: byte}
    training: {max_steps: 40, micro_batch: 1, global_batch: 2}
"""
DEAD_CONF = """ClusterName=dead
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={port}
AuthType=auth/munge
NodeName=n1 NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN
PartitionName=p Nodes=n1 Default=YES
"""
REFUSING = [("submit", "p.yaml", "--run-dir", "run"), ("logs", "p.yaml", "--run-dir", "run"),
            ("cancel", "p.yaml", "--run-dir", "run"), ("validate", "suite", "p.yaml"),
            ("image", "check", "p.yaml", "--no-container")]

pytestmark = pytest.mark.skipif(shutil.which("scontrol") is None, reason="needs the Slurm client (slurm-client)")


@pytest.fixture(params=["dead-port", "no-conf"])
def situation(request, tmp_path, monkeypatch):
    """(what the line must name) with the environment set up; the project and a run with a recorded job in cwd."""
    monkeypatch.delenv("CLUSTERTRAIN_DEBUG", raising=False)
    if request.param == "dead-port":
        port = free_ports(1)[0]  # free a moment ago: nothing listens there
        conf = tmp_path / "etc" / "slurm.conf"
        conf.parent.mkdir()
        conf.write_text(DEAD_CONF.format(port=port))
        monkeypatch.setenv("SLURM_CONF", str(conf))
        expect = (f"SLURM_CONF={conf} (controller 127.0.0.1:{port})", "is DOWN")
    else:
        if Path("/etc/slurm/slurm.conf").exists():
            pytest.skip("this machine has /etc/slurm/slurm.conf: without SLURM_CONF the client reads it")
        monkeypatch.delenv("SLURM_CONF", raising=False)
        expect = ("SLURM_CONF unset and no /etc/slurm/slurm.conf", "Could not establish a configuration source")
    work = tmp_path / "work"
    work.mkdir()
    (work / "p.yaml").write_text(PROJECT)
    paths = RunPaths(work / "run")
    paths.root.mkdir()
    add_record(paths, JobRecord(job_id="41", model="tiny", job_name="unreach-tiny", submitted=time.time() - 60,
                                script=str(work / "run/jobs/x.sbatch"), output=str(work / "run/logs/slurm-41.out")))
    write_status_record(paths, RunStatus(state=State.RUNNING, step=17))
    monkeypatch.chdir(work)
    return expect


@pytest.mark.parametrize("argv", REFUSING, ids=[" ".join(a[:2]) if a[0] in ("validate", "image") else a[0]
                                                for a in REFUSING])
def test_refused_in_one_line_before_anything_is_written(situation, argv):
    before = snapshot(Path.cwd())
    result = CliRunner().invoke(app, list(argv), prog_name="clustertrain")
    assert "Traceback" not in result.output
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("error: Slurm not reachable: `scontrol ping` with "), line
    for text in (*situation, LOCAL_ENV_FIX):
        assert text in line, (text, line)
    assert snapshot(Path.cwd()) == before  # no jobs/*.sbatch, no config.yaml, no suite directory


def test_status_says_so_and_shows_the_run_directory(situation):
    before = snapshot(Path.cwd())
    result = CliRunner().invoke(app, ["status", "p.yaml", "--run-dir", "run", "--json"], prog_name="clustertrain")
    assert "Traceback" not in result.output
    assert result.exit_code in (0, 1), result.output
    [note] = result.stderr.splitlines()
    assert note.startswith("note: Slurm not reachable: ") and LOCAL_ENV_FIX in note and situation[0] in note
    [row] = json.loads(result.stdout)
    assert row["step"] == 17 and row["job_id"] == "41"  # what the run directory says
    assert snapshot(Path.cwd()) == before


def test_a_missing_slurm_conf_file_is_answered_at_once(tmp_path):
    started = time.monotonic()
    problem = slurm_unreachable({"SLURM_CONF": str(tmp_path / "nope.conf")})  # scontrol would retry for 60 s
    assert time.monotonic() - started < 5
    assert problem == (f"Slurm not reachable: SLURM_CONF={tmp_path / 'nope.conf'} is not a file; point SLURM_CONF at "
                       f"a running cluster's slurm.conf, for the local cluster: {LOCAL_ENV_FIX}")
