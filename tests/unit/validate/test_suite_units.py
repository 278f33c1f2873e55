"""The suite's check units one by one on recorded results directories (gather -> evaluate), the job row each
job gets, Slurm's states in the one vocabulary, report.json read back, and the job-side entry points reading
their config file (``validate storage/collectives --config``)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from clustertrain.cli.validate import app
from clustertrain.launch.batch import to_state
from clustertrain.resolve import load_project
from clustertrain.core.states import State
from clustertrain.validate.scan import CheckResult, ScanReport
from clustertrain.validate.storagebench import StorageBenchConfig
from clustertrain.validate.suite import (
    JobOutcome, SuiteConfig, SuitePaths, SuiteReport, gather, job_rows, plan_suite, suite_context,
)
from clustertrain.validate.suite_checks import CHECKS, gpu_efa, smoke, storage
from clustertrain import __version__
from tests.support.golden import check_golden

FIXTURES = Path(__file__).parent / "fixtures"
PROJECT = """
name: vs
cluster: {{backend: slurm, nodes: 2, gpus_per_node: 0, procs_per_node: 1}}
storage: {{root: {root}}}
models:
  - name: tiny
    model: {{layers: 2, hidden: 64, heads: 4, seq_len: 64}}
    training: {{max_steps: 2, micro_batch: 4, global_batch: 8}}
"""
runner = CliRunner()


def planned(tmp_path: Path):
    path = tmp_path / "p.yaml"
    path.write_text(PROJECT.format(root=json.dumps(str(tmp_path / "fsx"))))
    project = load_project(path)
    paths = SuitePaths(tmp_path / "suite")
    cfg = SuiteConfig(nodes=2, storage=StorageBenchConfig(size_mib=4, files=100))
    jobs, _ = plan_suite(project, cfg, paths)
    for job in jobs:
        job.results_dir.mkdir(parents=True)
    return suite_context(project, cfg, paths), {j.name: j for j in jobs}


def done(name: str, state: State = State.COMPLETED, exit_code: int = 0, slurm: str | None = "COMPLETED") -> JobOutcome:
    return JobOutcome(name=name, job_id="41", state=state, slurm_state=slurm, exit_code=exit_code)


def test_every_unit_has_the_same_shape():
    assert [u.NAME for u in CHECKS] == ["smoke", "gpu-efa", "collectives", "nccl-tests", "storage"] and smoke.NAME == "smoke"
    for unit in CHECKS:
        assert all(callable(getattr(unit, f)) for f in ("not_applicable", "plan", "gather"))


def test_slurm_states_in_the_one_vocabulary():
    assert [to_state(s) for s in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "STOPPED", "COMPLETED",
                                  "CANCELLED by 0", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY", "")] == [
        State.PENDING, State.PENDING, State.RUNNING, State.RUNNING, State.RUNNING, State.COMPLETED,
        State.CANCELLED, State.TIMEOUT, State.STOPPED, State.FAILED, State.FAILED, State.UNKNOWN]


def test_job_row_tells_our_cancel_from_slurms_end(tmp_path):
    cfg = SuiteConfig(job_timeout_s=30, start_timeout_s=20)
    ctx_job = planned(tmp_path)[1]["smoke"]
    rows, readable = job_rows(ctx_job, JobOutcome(name="smoke", job_id="7", state=State.TIMEOUT), cfg)
    assert not readable and (rows[0].verdict, rows[0].found) == ("fail", "still running after 30s; cancelled")
    rows, readable = job_rows(ctx_job, JobOutcome(name="smoke", job_id="7", state=State.NOT_STARTED), cfg)
    assert not readable and rows[0].found == "still pending after 20s; cancelled"
    rows, readable = job_rows(ctx_job, done("smoke", State.TIMEOUT, 0, "TIMEOUT"), cfg)  # Slurm's own time limit
    assert readable and rows[0].verdict == "fail" and "Slurm's time limit" in rows[0].detail
    rows, _ = job_rows(ctx_job, done("smoke", State.FAILED, 1, "NODE_FAIL"), cfg)
    assert (rows[0].verdict, rows[0].found) == ("pass", "FAILED (NODE_FAIL), exit 1") and "non-zero" in rows[0].detail
    rows, _ = job_rows(ctx_job, done("smoke", State.UNKNOWN, None, None), cfg)
    assert rows[0].verdict == "warn"


def test_smoke_gathers_hosts_and_scans_and_says_why_one_is_missing(tmp_path):
    ctx, jobs = planned(tmp_path)
    job = jobs["smoke"]
    scan = ScanReport(role="compute", instance_type=None, family="default", failed=False, checks=[
        CheckResult(name="slurm", status="pass", found="slurm 22.05", required="installed")])
    (job.results_dir / "host-0.txt").write_text("node1 vm1\n")
    (job.results_dir / "host-1.txt").write_text("node2 vm2\n")
    (job.results_dir / "scan-0.json").write_text("srun: a line before the JSON\n" + scan.model_dump_json())
    (job.results_dir / "scan-1.json.err").write_text("python: No module named clustertrain\n")
    (job.results_dir / "python-0.txt").write_text(f"/usr/bin/python3.11 3.11.9 {__version__}\n")
    (job.results_dir / "python-1.txt.err").write_text("ModuleNotFoundError: No module named 'clustertrain'\n")
    rows = gather(job, done("smoke", State.COMPLETED, 1), ["node1", "node2"], ctx)
    by = {r.check: r for r in rows}
    assert by["job"].verdict == "pass" and by["slurm"].verdict == "pass"
    assert by["nodes"].verdict == "fail" and by["nodes"].found == "2/2: node1 vm1, node2 vm2"
    assert "node2: no scan result" in by["nodes"].detail and "No module named clustertrain" in by["nodes"].detail
    # the interpreter step: node2's interpreter does not import clustertrain, named with the fix
    assert (by["interpreter"].verdict, by["interpreter"].found) == ("fail", "1/2 node(s) failed")
    assert by["interpreter"].detail.startswith("node2: ! ModuleNotFoundError") and "launch.python" in by["interpreter"].detail
    (job.results_dir / "scan-1.json").write_text(scan.model_dump_json())
    (job.results_dir / "python-1.txt").write_text(f"/usr/bin/python3.11 3.11.9 {__version__}\n")
    rows = gather(job, done("smoke"), ["node1", "node2"], ctx)
    assert {r.verdict for r in rows} == {"pass"}
    assert [r.found for r in rows if r.check == "interpreter"] == [f"/usr/bin/python3.11 (Python 3.11.9), clustertrain {__version__}"]
    (job.results_dir / "python-1.txt").write_text("/usr/bin/python3.11 3.11.9 0.0.1\n")  # an image built from another version
    [row] = [r for r in gather(job, done("smoke"), ["node1", "node2"], ctx) if r.check == "interpreter"]
    assert row.verdict == "warn" and "clustertrain 0.0.1" in row.found and "rebuild the image" in row.detail


def test_gpu_efa_gathers_per_node_files(tmp_path):
    ctx, jobs = planned(tmp_path)
    job = gpu_efa.plan(ctx)[0]  # planned by hand: a CPU project skips it
    assert gpu_efa.not_applicable(ctx) == "not applicable: gpus_per_node=0"
    assert job.steps[0][-3:] == ("nvidia-smi", gpu_efa.QUERY, "--format=csv")
    assert f"--output={job.results_dir}/nvidia-smi-%n.csv" in job.steps[0]
    job.results_dir.mkdir(parents=True)
    smi = (FIXTURES / "nvidia-smi-query-gpu-8xh100-sample.csv").read_text().split("\n", 1)[1]
    (job.results_dir / "nvidia-smi-0.csv").write_text(smi)
    (job.results_dir / "nvlink-0.txt").write_text("GPU 0: H100\n\t Link 0: <inactive>\n")
    rows = {r.check: r for r in gather(job, done("gpu-efa"), ["a", "b"], ctx)}
    assert rows["gpus a"].found.startswith("8 x NVIDIA H100") and rows["gpus b"].verdict == "pass"  # 0 GPUs needed
    assert (rows["nvlink a"].verdict, rows["nvlink b"].verdict) == ("fail", "warn")  # inactive link; nothing listed
    assert (rows["host b"].verdict, rows["host b"].found) == ("fail", "no host scan")  # the host script left nothing


def test_host_scan_reads_modules_efa_installer_and_enroot(tmp_path):
    """The gpu-efa job is the host scan: what only the bare node shows (the image's software is the smoke scan's)."""
    import subprocess

    project = load_project(Path(__file__).parents[3] / "examples" / "p5e-80x7.yaml")  # p5e: EFA expected, an image
    ctx = suite_context(project, SuiteConfig(nodes=1), SuitePaths(tmp_path / "s"))
    [job] = gpu_efa.plan(ctx)
    assert job.steps[3][-3:-1] == ("bash", "-c") and not any("--container" in w for s in job.steps for w in s)
    # the script itself, on this machine (no GPU, no EFA, no Enroot here): every line says absent
    here = subprocess.run(["bash", "-c", gpu_efa.HOST_SCRIPT], capture_output=True, text=True, check=True).stdout
    assert gpu_efa.parse_host(here) == {"module nvidia": "absent", "module efa": "absent", "module gdrdrv": "absent",
                                        "efa_installer": "absent", "enroot": "absent"}
    rows = {r.check: r for r in gpu_efa.host_rows(project, "n1", here, efa_expected=True)}
    assert [r.verdict for r in rows.values()] == ["fail", "fail", "fail"]
    assert rows["modules n1"].detail == "nvidia module not loaded; efa module not loaded"
    # a node as a p5e compute node reads (driver, EFA module, GDRCopy's module, EFA installer, Enroot)
    good = ("module nvidia 580.173.02\nmodule efa 2.17.1g\nmodule gdrdrv loaded\nefa_installer 1.51.0\n"
            "enroot 4.1.2\n")
    rows = {r.check: r for r in gpu_efa.host_rows(project, "n1", good, efa_expected=True)}
    assert [r.verdict for r in rows.values()] == ["pass", "pass", "pass"]
    assert rows["modules n1"].found == "nvidia 580.173.02, efa 2.17.1g, gdrdrv loaded"
    old = good.replace("580.173.02", "470.82.01").replace("module gdrdrv loaded", "module gdrdrv absent")
    rows = {r.check: r for r in gpu_efa.host_rows(project, "n1", old.replace("1.51.0", "1.20.0"), efa_expected=True)}
    assert rows["modules n1"].verdict == "fail" and rows["modules n1"].detail.startswith("driver 470.82.01 < 535.54.03")
    assert rows["efa_installer n1"].verdict == "fail" and "minimum from" in rows["efa_installer n1"].detail
    rows = {r.check: r for r in gpu_efa.host_rows(project, "n1", good.replace("gdrdrv loaded", "gdrdrv absent"), True)}
    assert rows["modules n1"].verdict == "warn" and "GDRCopy" in rows["modules n1"].detail


def test_storage_gathers_its_result_or_says_why_there_is_none(tmp_path):
    ctx, jobs = planned(tmp_path)
    job = jobs["storage-1"]
    assert storage.NAME == job.check and job.target == str(tmp_path / "fsx")
    rows = gather(job, done("storage-1", State.FAILED, 2, "FAILED"), [], ctx)
    assert [(r.check, r.verdict, r.found) for r in rows][1] == (f"bench {job.target}", "fail", "no JSON result")
    (job.results_dir / "storage.json").write_text(json.dumps({
        "kind": "storage", "tool": "python", "results": [{"target": job.target, "tool": "python", "write_mib_s": 90.0,
                                                          "read_mib_s": 120.0, "create_per_s": 1.0, "stat_per_s": 2.0,
                                                          "unlink_per_s": 3.0, "cache_bypass": "direct"}]}))
    rows = gather(job, done("storage-1"), [], ctx)
    assert [r.verdict for r in rows] == ["pass", "pass", "pass", "pass"] and rows[1].found == "90 MiB/s"


def test_report_reads_back_old_and_newer_files(tmp_path):
    paths = SuitePaths(tmp_path)
    report = SuiteReport(project="vs", nodes=2, instance_type=None, thresholds="cpu", directory=str(tmp_path),
                         started="2026-01-01T00:00:00", jobs=[done("smoke")])
    report.finish().write(paths)
    assert SuiteReport.model_validate_json(paths.report.read_text()) == report
    raw = json.loads(paths.report.read_text())
    raw["jobs"][0]["state"] = "completed"  # an older writer's spelling
    raw["added_by_a_newer_version"] = 1
    again = SuiteReport.model_validate(raw)
    assert again.jobs[0].state is State.COMPLETED and not list(tmp_path.glob(".report.json.*"))


def test_storage_entry_reads_its_config_file(tmp_path):
    config = tmp_path / "storage.json"
    config.write_text(StorageBenchConfig(size_mib=2, files=20, engine="python").model_dump_json())
    res = runner.invoke(app, ["storage", str(tmp_path), "--config", str(config), "--json"])
    assert res.exit_code == 0, res.output
    [result] = json.loads(res.output[res.output.index("{"):])["results"]
    assert any(n.endswith("KiB blocks, 2 MiB") for n in result["notes"]), result["notes"]  # the file's size_mib
    both = runner.invoke(app, ["storage", str(tmp_path), "--config", str(config), "--size", "4M"])
    assert both.exit_code == 2 and "drop --size" in both.output and "Traceback" not in both.output
    config.write_text("size_mib: 2\nfiels: 20\n")
    bad = runner.invoke(app, ["storage", str(tmp_path), "--config", str(config)])
    assert bad.exit_code == 2 and f"{config}:2: fiels: unknown key" in bad.output and "Traceback" not in bad.output


def test_collectives_entry_refuses_a_config_plus_options_and_a_bad_file(tmp_path):
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"ops": ["all_reduce"], "max_bytes": 64}))
    both = runner.invoke(app, ["collectives", "--config", str(config), "--iters", "3"])
    assert both.exit_code == 2 and "drop --iters" in both.output
    config.write_text(json.dumps({"ops": ["allreduce"]}))
    bad = runner.invoke(app, ["collectives", "--config", str(config)])
    assert bad.exit_code == 2 and "ops" in bad.output and "valid ops are" in bad.output and "Traceback" not in bad.output


GOLDEN = Path(__file__).parent / "golden"


def test_golden_collectives_job_and_its_config(tmp_path):
    """The rendered script and config file of the CPU collectives job, byte for byte (regenerate after an intended
    change with ``CLUSTERTRAIN_UPDATE_GOLDEN=1 pytest tests/unit/validate/test_suite_units.py`` and review the diff)."""
    import dataclasses

    from clustertrain.validate.suite import render_job

    path = tmp_path / "p.yaml"
    path.write_text(PROJECT.format(root=json.dumps("/fsx/st 'o\"r#e%x")).replace(
        "models:", 'launch: {exclusive: false, srun_args: ["--cpu-bind=none"], sbatch_args: ["--qos=a b"]}\nmodels:'))
    paths = SuitePaths(Path("/fsx/st 'o\"r#e%x/vs/validation/20260101-000000"))
    cfg = SuiteConfig(nodes=2, job_timeout_s=90, python="/opt/py/bin/python")
    [coll] = [j for j in plan_suite(load_project(path), cfg, paths)[0] if j.name == "collectives"]
    coll = dataclasses.replace(coll, version="0.0.0-golden")  # a release bump does not change the golden file
    [(config_path, config_text)] = coll.files
    rendered = {"validate_collectives_cpu.sh": render_job(coll, paths), "validate_collectives_cpu.json": config_text}
    assert config_path == paths.config("collectives")
    for name, text in rendered.items():
        check_golden(GOLDEN / name, text)
