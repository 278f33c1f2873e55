"""The validation suite as values: job plans, rendered batch scripts (run through bash, hostile paths),
thresholds and the evaluation of recorded results. The Slurm runs are in tests/integration/validate/test_suite.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from clustertrain.core.errors import LaunchError
from clustertrain.launch.sbatch import sbatch_quote
from clustertrain.resolve import load_project
from clustertrain.validate import CollectiveRun, CollectivesConfig, StorageRun, parse_output_file
from clustertrain.validate.results import ValidateError, parse_size
from clustertrain.validate.scan import CheckResult, ScanReport
from clustertrain.validate.storagebench import StorageBenchConfig
from clustertrain.validate.suite import (
    SuiteConfig, SuitePaths, ThresholdsConfig, default_max_bytes, evaluate_collectives, evaluate_gpu_efa, evaluate_smoke,
    evaluate_storage, load_thresholds, new_suite_dir, plan_suite, render_job, resolve_nodes, storage_targets,
    thresholds_key, validation_base,
)

FIXTURES = Path(__file__).parent / "fixtures"
EXAMPLE_P5E = Path(__file__).parents[3] / "examples" / "p5e-80x7.yaml"
HOSTILE = "x'; touch INJECTED; echo '"

CPU_PROJECT = """
name: vs
cluster: {{backend: slurm, nodes: 2, gpus_per_node: 0, procs_per_node: 1}}
storage: {{root: {root}}}
launch: {{exclusive: false, srun_args: ["--cpu-bind=none"]}}
models:
  - name: tiny
    model: {{layers: 2, hidden: 64, heads: 4, seq_len: 64}}
    training: {{max_steps: 2, micro_batch: 4, global_batch: 8}}
"""

# Recorded from a real 2-node gloo run of the suite on the local Slurm cluster (rows cut to 2 sizes, 2 ops).
RECORDED_GLOO = {"format_version": 1, "kind": "collectives", "tool": "clustertrain", "backend": "gloo", "world_size": 2,
                 "reports": [
                     {"op": "all_reduce", "nranks": 2, "complete": True, "failed": False, "problems": [], "rows": [
                         {"size_bytes": 8, "count": 2, "redop": "sum", "root": -1, "time_us": 532.25,
                          "algbw_gbps": 1.503e-05, "busbw_gbps": 1.503e-05, "wrong": 0},
                         {"size_bytes": 16, "count": 4, "redop": "sum", "root": -1, "time_us": 2376.7,
                          "algbw_gbps": 6.73e-06, "busbw_gbps": 6.73e-06, "wrong": 0}]},
                     {"op": "all_gather", "nranks": 2, "complete": True, "failed": False, "problems": [], "rows": [
                         {"size_bytes": 8, "count": 1, "redop": "none", "root": -1, "time_us": 984.7,
                          "algbw_gbps": 8.12e-06, "busbw_gbps": 4.06e-06, "wrong": 0}]}],
                 "failed": False, "problems": [], "warnings": []}
RECORDED_STORAGE = {"format_version": 1, "kind": "storage", "tool": "fio", "results": [
    {"target": "/tmp/st/fsx", "tool": "fio", "fs_type": "ext4", "write_mib_s": 400.0, "read_mib_s": 571.43,
     "create_per_s": 57548.0, "stat_per_s": 533996.9, "unlink_per_s": 320150.6}], "failed": False, "problems": [],
    "warnings": []}


def cpu_project(tmp_path: Path, root: Path | None = None):
    path = tmp_path / "p.yaml"
    path.write_text(CPU_PROJECT.format(root=json.dumps(str(root or tmp_path / "fsx"))))
    return load_project(path)


def small() -> SuiteConfig:
    return SuiteConfig(nodes=2, job_timeout_s=90, collectives=CollectivesConfig(max_bytes=64 << 10, iters=3, timeout_s=20),
                       storage=StorageBenchConfig(size_mib=4, files=100), python="/opt/py/bin/python")


def config_of(job) -> dict:
    """The config file a job's step reads (``--config``), as planned: written before submission."""
    [(path, text)] = job.files
    assert str(path) in job.steps[0] and job.steps[0][job.steps[0].index("--config") + 1] == str(path)
    return json.loads(text)


def srun_argv(script: str, index: int = 0) -> list[str]:
    """Run the index-th srun line of a rendered script through bash with srun printing its argv."""
    lines = [ln for ln in script.splitlines() if ln.startswith("srun ")]
    proc = subprocess.run(["bash", "-c", 'srun() { printf "%s\\0" srun "$@"; }\n' + lines[index]],
                          capture_output=True, text=True, check=True)
    return proc.stdout.split("\0")[:-1]


def test_cpu_plan_has_smoke_collectives_storage_and_skips_gpu_efa(tmp_path):
    project = cpu_project(tmp_path)
    paths = SuitePaths(tmp_path / "suite")
    jobs, skipped = plan_suite(project, small(), paths)
    assert [j.name for j in jobs] == ["smoke", "collectives", "storage-1"]
    assert skipped == {"gpu-efa": "not applicable: gpus_per_node=0", "nccl-tests": "not applicable: gpus_per_node=0"}
    smoke, coll, stor = jobs
    assert (smoke.nodes, smoke.ntasks_per_node, len(smoke.outputs)) == (2, 1, 6)
    assert smoke.steps[1][-3:-1] == ("/opt/py/bin/python", "-c")  # the interpreter step, on the host (no image)
    assert smoke.steps[2][-5:] == ("validate", "scan", "--role", "compute", "--json")
    assert not any("--container-image" in w for j in jobs for s in j.steps for w in s)  # a CPU project: on the hosts
    assert coll.steps[0][:4] == ("srun", "--nodes=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1")
    assert "--cpu-bind=none" in coll.steps[0] and "--cpu-bind=none" in smoke.steps[0]
    # the check's config goes to the job as a file, not re-serialised into flags
    assert coll.steps[0][-8:] == ("/opt/py/bin/python", "-m", "clustertrain", "validate", "collectives", "--json",
                                  "--config", str(paths.config("collectives")))
    assert config_of(coll) == {**small().collectives.model_dump(), "backend": "gloo", "max_bytes": 64 << 10}
    assert coll.env.set["OMP_NUM_THREADS"] == "1"
    assert coll.outputs == (paths.results("collectives") / "collectives-0.json",)
    assert stor.nodes == 1 and stor.target == str(tmp_path / "fsx")
    assert stor.steps[0][-5:] == ("storage", str(tmp_path / "fsx"), "--config", str(paths.config("storage")), "--json")
    assert config_of(stor) == small().storage.model_dump() and config_of(stor)["size_mib"] == 4
    script = render_job(coll, paths)
    assert "#SBATCH --exclusive" not in script and "#SBATCH --no-requeue" in script and '#SBATCH --time="3"' in script
    assert srun_argv(script) == list(coll.steps[0])
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    assert "export NCCL_DEBUG" not in script  # gloo: no NCCL log to read


def test_default_sweep_is_small_on_cpu_and_reaches_the_bands_on_gpus(tmp_path):
    """Item 10a: the old default (64 MiB) never reached p5e's 1 GiB band, so a default run had no bandwidth verdict."""
    def top(project) -> int:
        [coll] = [j for j in plan_suite(project, SuiteConfig(nodes=2), SuitePaths(tmp_path / "s"))[0]
                  if j.name == "collectives"]
        return config_of(coll)["max_bytes"]

    assert top(cpu_project(tmp_path)) == 1 << 20
    p5e = load_project(EXAMPLE_P5E)
    assert top(p5e) == 1 << 30 and parse_size(load_thresholds().instance_types["p5e"].collectives["all_reduce"]
                                              .min_bytes) <= top(p5e)
    table = load_thresholds()
    table.instance_types["p5e"].collectives["all_reduce"].min_bytes = "3G"  # a band further out: the sweep follows
    assert default_max_bytes(table, "p5e", 8) == 4 << 30 and default_max_bytes(table, "p5e", 8, 1000, 4) >= 3 << 30
    assert default_max_bytes(table, "default", 8) == 1 << 30 and default_max_bytes(table, "cpu", 0) == 1 << 20
    # `validate collectives` on its own: the same rule from the backend it runs on
    assert CollectivesConfig().top("nccl") == 1 << 30 and CollectivesConfig().top("gloo") == 1 << 20
    assert len(CollectivesConfig().sizes("nccl")) == 28 and CollectivesConfig(max_bytes=64).top("nccl") == 64


def test_gpu_project_plans_gpu_efa_job_nccl_and_fsx_storage_jobs(tmp_path):
    project = load_project(EXAMPLE_P5E)
    jobs, skipped = plan_suite(project, SuiteConfig(nodes=10), SuitePaths(tmp_path / "s"))
    assert skipped == {} and [j.name for j in jobs] == ["smoke", "gpu-efa", "collectives", "nccl-tests", "storage-1",
                                                        "storage-2", "storage-3"]
    # the storage layout's mounts (datasets, checkpoints+outputs, logs+tensorboard); never /fsx, each node's root volume,
    # and on each the project's own directory that the node scripts create, never the mount's root-owned top
    assert [j.target for j in jobs[4:]] == [f"/fsx/{m}/p5e-80x7/validation/storage-bench" for m in ("data", "checkpoints", "logs")]
    assert Path("/fsx") not in storage_targets(project)
    gpu, coll = jobs[1], jobs[2]
    assert [s[-3:] for s in gpu.steps][1] == ("efa", "-t", "FI_EP_RDM")
    assert coll.ntasks_per_node == 8 and config_of(coll)["backend"] == "nccl"
    script = render_job(coll, SuitePaths(tmp_path / "s"))
    assert "#SBATCH --gpus-per-node=8" in script and "#SBATCH --partition=\"gpu-queue\"" in script
    assert "#SBATCH --exclusive" in script and "export NCCL_SOCKET_IFNAME=" in script  # the project's NCCL/EFA preset
    # the transport verdict's input: NCCL's INFO log per process, relative to the results dir the script cd's into
    assert "export NCCL_DEBUG=INFO\n" in script and "export NCCL_DEBUG_FILE=nccl-%h-%p.log\n" in script
    assert script.index('cd "$RESULTS"') < script.index("\nsrun ")
    assert srun_argv(script)[:3] == ["srun", "--nodes=10", "--ntasks-per-node=8"]


def test_results_and_storage_paths_follow_the_layout(tmp_path):
    """The suite writes under the layout's outputs base and benchmarks the mounts holding the layout's bases; an
    aws: project whose results would land off its shared mounts is refused naming the field."""
    project = load_project(EXAMPLE_P5E)
    assert validation_base(project) == Path("/fsx/checkpoints/p5e-80x7/validation")  # holds: [checkpoints, outputs]
    moved = load_project(EXAMPLE_P5E, ["storage.outputs=/fsx/logs/out"])
    assert validation_base(moved) == Path("/fsx/logs/out/p5e-80x7/validation")
    off = load_project(EXAMPLE_P5E, ["storage.outputs=/home/ec2-user/out"])
    with pytest.raises(ValidateError, match=r"^storage\.outputs: /home/ec2-user/out \(outputs\) is not on a shared "
                                            r"file system .*mounts: /fsx/data, /fsx/checkpoints"):
        new_suite_dir(off)
    runs_off = load_project(EXAMPLE_P5E, ["storage.runs=/fsx/run-dirs"])  # /fsx itself is no mount
    assert Path("/fsx/run-dirs") not in storage_targets(runs_off) and Path("/fsx") not in storage_targets(runs_off)
    local = cpu_project(tmp_path)
    paths = new_suite_dir(local)
    assert paths.root.parent == tmp_path / "fsx" / "vs" / "validation" and paths.root.is_dir()
    assert storage_targets(local) == [tmp_path / "fsx"]


def test_hostile_storage_root_is_quoted_everywhere(tmp_path):
    root = tmp_path / "a 0" / 'a"=0"' / HOSTILE / "50%#x"
    project = cpu_project(tmp_path, root)
    paths = SuitePaths(root / "validation" / "vs" / "t")
    jobs, _ = plan_suite(project, small(), paths)
    for job in jobs:
        script = render_job(job, paths)
        subprocess.run(["bash", "-n"], input=script, text=True, check=True)
        for i, step in enumerate(job.steps):
            argv = srun_argv(script, i)
            assert argv == list(step)
            out = next(a for a in argv if a.startswith("--output="))
            assert out.startswith("--output=" + str(job.results_dir).replace("%", "%%") + "/")  # Slurm pattern escape
        assert f"#SBATCH --output={sbatch_quote(str(paths.logs).replace('%', '%%') + '/%x-%j.out')}" in script
        assert f"RESULTS={job.results_dir}" not in script  # quoted, not bare
    assert jobs[-1].target == str(root)
    assert not list(tmp_path.rglob("INJECTED"))


def test_newline_in_paths_is_refused(tmp_path):
    project = cpu_project(tmp_path, tmp_path / "bad\nroot")
    with pytest.raises(LaunchError, match="newline"):
        plan_suite(project, small(), SuitePaths(tmp_path / "s"))


def test_absent_fault_wrapper_withholds_only_that_rank(tmp_path):
    cfg = small()
    cfg.collectives = CollectivesConfig(max_bytes=64, fault="absent:1")
    [coll] = [j for j in plan_suite(cpu_project(tmp_path), cfg, SuitePaths(tmp_path / "s"))[0] if j.name == "collectives"]
    step = list(coll.steps[0])
    tail = step[step.index("bash"):]
    assert "--fault" not in tail  # the collectives CLI never sees it: rank 1 just never starts
    tail[tail.index("/opt/py/bin/python")] = "echo"
    run = [subprocess.run(tail, env={"SLURM_PROCID": r, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
           for r in ("0", "1")]
    assert run[0].returncode == 0 and run[0].stdout.startswith("-m clustertrain validate collectives --json --config")
    assert config_of(coll)["fault"] is None
    assert run[1].returncode == 0 and run[1].stdout == "" and "withheld" in run[1].stderr
    cfg.collectives = CollectivesConfig(max_bytes=64, fault="hang:1:all_reduce")
    [coll] = [j for j in plan_suite(cpu_project(tmp_path), cfg, SuitePaths(tmp_path / "s"))[0] if j.name == "collectives"]
    assert config_of(coll)["fault"] == "hang:1:all_reduce" and "bash" not in coll.steps[0]


def test_thresholds_table_and_lookup(tmp_path):
    table = load_thresholds()
    assert thresholds_key(table, "p5.48xlarge", 8) == "p5" and thresholds_key(table, "p5en.48xlarge", 8) == "p5en"
    assert thresholds_key(table, "g6.12xlarge", 4) == "default" and thresholds_key(table, "p5.48xlarge", 0) == "cpu"
    assert table.instance_types["cpu"].collectives == {}
    bad = tmp_path / "t.yaml"
    bad.write_text("version: 1\ninstance_types: {p5: {collectives: {all_reduce: {min_bytes: 1G}}}}\nfsx: "
                   "{min_fraction: 0.5, client_cap_mib_s: 100}\n")
    with pytest.raises(ValidateError, match=r"t.yaml:2: instance_types.p5.collectives.all_reduce.warn_below_gbps: required"):
        load_thresholds(bad)


def test_resolve_nodes(tmp_path):
    project = cpu_project(tmp_path)
    assert resolve_nodes("all", project, 7) == 7 and resolve_nodes("all", project, None) == 2
    assert resolve_nodes("2", project, 2) == 2
    with pytest.raises(ValidateError, match="has only 2 node"):
        resolve_nodes("10", project, 2)
    with pytest.raises(ValidateError, match="give a node count"):
        resolve_nodes("ten", project, None)


def test_collectives_on_recorded_gloo_run_correctness_only(tmp_path):
    table = load_thresholds()
    run = CollectiveRun.model_validate(RECORDED_GLOO)
    rows = evaluate_collectives(run, 2, 2, table, "cpu", 20)
    assert [(r.check, r.verdict) for r in rows] == [("ranks", "pass"), ("all_reduce correctness", "pass"),
                                                    ("all_gather correctness", "pass"), ("busbw", "not-applicable")]
    assert rows[1].found == "2 size(s), 0 wrong"
    assert rows[3].detail == "thresholds.yaml cpu: CPU/gloo rehearsal: correctness only, no bandwidth band"
    bad = json.loads(json.dumps(RECORDED_GLOO))
    bad["reports"][0]["rows"][1]["wrong"] = 3
    bad["reports"][0].update(failed=True, problems=["size 16: wrong elements on rank(s) 1:3"])
    rows = evaluate_collectives(CollectiveRun.model_validate(bad).finish(), 2, 2, table, "cpu", 20)
    assert [r.verdict for r in rows] == ["pass", "fail", "pass", "not-applicable"] and "wrong elements" in rows[1].detail
    assert evaluate_collectives(run, 4, 2, table, "cpu", 20)[0].verdict == "fail"  # a rank short


def test_never_joined_is_a_failed_run_row():
    run = CollectiveRun(tool="clustertrain", backend="gloo", world_size=2,
                        problems=["rank(s) 1 never joined within 8s"]).finish()
    rows = evaluate_collectives(run, 2, 2, load_thresholds(), "cpu", 8)
    assert [(r.check, r.verdict) for r in rows] == [("ranks", "pass"), ("run", "fail"), ("busbw", "not-applicable")]
    assert rows[1].found == "rank(s) 1 never joined within 8s"


def test_busbw_bands_on_nccl_tests_output():
    run = parse_output_file(FIXTURES / "nccl-all_reduce-16rank-efa-srun-prefix.txt")  # peak 876.49 GB/s at 1 GiB
    table = load_thresholds()
    [band] = [r for r in evaluate_collectives(run, 16, 2, table, "p5", 60) if r.check == "all_reduce busbw"]
    assert (band.verdict, band.found) == ("pass", "876.5 GB/s peak")
    strict = ThresholdsConfig.model_validate({**table.model_dump(), "instance_types": {"x": {"collectives": {
        "all_reduce": {"min_bytes": "1G", "warn_below_gbps": 1000, "fail_below_gbps": 900}}}}})
    assert [r.verdict for r in evaluate_collectives(run, 16, 2, strict, "x", 60) if "busbw" in r.check] == ["fail"]
    strict.instance_types["x"].collectives["all_reduce"].fail_below_gbps = 800
    assert [r.verdict for r in evaluate_collectives(run, 16, 2, strict, "x", 60) if "busbw" in r.check] == ["warn"]
    strict.instance_types["x"].collectives["all_reduce"].min_bytes = "2G"
    [nm] = [r for r in evaluate_collectives(run, 16, 2, strict, "x", 60) if "busbw" in r.check]
    assert (nm.verdict, nm.found) == ("warn", "not measured")
    assert nm.detail == "the sweep stopped at 1G; the band starts at 2G: leave --max-bytes at its default (or raise it)"
    assert [r.verdict for r in evaluate_collectives(run, 16, 1, table, "p5", 60) if "busbw" in r.check] == ["not-applicable"]


def test_storage_on_recorded_run_and_fsx_rule(tmp_path):
    table = load_thresholds()
    rows = evaluate_storage("storage-1", cpu_project(tmp_path), StorageRun.model_validate(RECORDED_STORAGE), table)
    assert [(r.check, r.verdict, r.found) for r in rows][:2] == [("write /tmp/st/fsx", "pass", "400 MiB/s"),
                                                                 ("read /tmp/st/fsx", "pass", "571 MiB/s")]
    assert rows[2].found.startswith("create 57548/s")
    fsx = json.loads(json.dumps(RECORDED_STORAGE))
    fsx["results"][0]["target"] = "/fsx/logs/x"  # fsx-logs: 500 MB/s/TiB x 4800 GiB -> cap 1200 x 0.25 = 300 MiB/s
    fsx["results"][0]["read_mib_s"] = 250.0
    rows = evaluate_storage("storage-4", load_project(EXAMPLE_P5E), StorageRun.model_validate(fsx), table)
    assert [(r.verdict, r.threshold.split(" (")[0]) for r in rows[:2]] == [("pass", ">= 300 MiB/s"), ("fail", ">= 300 MiB/s")]
    cached = json.loads(json.dumps(RECORDED_STORAGE))
    cached["results"][0]["cache_bypass"] = "none"  # the read may have come from memory: never a plain pass
    rows = evaluate_storage("storage-1", cpu_project(tmp_path), StorageRun.model_validate(cached), table)
    assert [(r.verdict, r.detail) for r in rows[:2]] == [("pass", "fio, page cache: none"),
                                                         ("warn", "fio, page cache: none (read may come from memory)")]
    cached["results"][0]["cache_bypass"] = "direct"
    rows = evaluate_storage("storage-1", cpu_project(tmp_path), StorageRun.model_validate(cached), table)
    assert [(r.verdict, r.detail) for r in rows[:2]] == [("pass", "fio, page cache: direct")] * 2
    broken = StorageRun(tool="fio", problems=["/x: only 3 MiB free, need 4 MiB"], failed=True)
    assert [(r.check, r.verdict) for r in evaluate_storage("storage-1", cpu_project(tmp_path), broken, table)] == \
        [("bench", "fail")]


def _scan(gpu_status: str) -> ScanReport:
    checks = [CheckResult(name="gpu", status=gpu_status, found="not found", required=">= 8 GPU(s)"),
              CheckResult(name="enroot", status="fail", found="not found", required="installed"),
              CheckResult(name="slurm", status="pass", found="slurm-wlm 22.05.8", required="installed")]
    return ScanReport(role="compute", instance_type=None, family="default", checks=checks, failed=True)


def test_smoke_counts_gpu_checks_only_with_gpus(tmp_path):
    rows = evaluate_smoke(cpu_project(tmp_path), ["node1", "node2"], ["node1 vm", "node2 vm"], [_scan("fail"), _scan("fail")])
    assert [(r.check, r.verdict) for r in rows] == [("nodes", "pass"), ("gpu", "not-applicable"),
                                                    ("enroot", "not-applicable"), ("slurm", "pass")]
    assert rows[1].detail == "not applicable: gpus_per_node=0"
    gpu = load_project(EXAMPLE_P5E, ["image=null"])  # on the host: no Enroot needed
    rows = evaluate_smoke(gpu, ["node1", "node2"], ["node1 vm", None], [_scan("fail"), None])
    assert [(r.check, r.verdict) for r in rows] == [("nodes", "fail"), ("gpu", "fail"), ("enroot", "not-applicable"),
                                                    ("slurm", "pass")]
    assert "node2: no scan result" in rows[0].detail


def test_gpu_efa_on_recorded_tool_output():
    project = load_project(EXAMPLE_P5E)  # p5e: 8 GPUs, 32 EFA devices per node (requirements.yaml)
    smi = (FIXTURES / "nvidia-smi-query-gpu-8xh100-sample.csv").read_text().split("\n", 1)[1]
    fi = (FIXTURES / "fi_info-efa-rdm-mpirun-sample.txt").read_text().split("\n", 1)[1]
    # `nvidia-smi nvlink -s` layout (written by us from NVIDIA's documented output): one GPU line, one line per link
    nvlink = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)\n\t Link 0: 26.562 GB/s\n\t Link 1: 26.562 GB/s\n"
    rows = evaluate_gpu_efa(project, ["n1"], [smi], [fi], [nvlink])
    by = {r.check: r for r in rows}
    assert by["gpus n1"].verdict == "pass" and by["gpus n1"].found.startswith("8 x NVIDIA H100")
    assert by["efa n1"].verdict == "fail" and by["efa n1"].threshold.startswith(">= 32 (p5e")  # the sample lists fewer
    assert (by["nvlink n1"].verdict, by["nvlink n1"].found) == ("pass", "2 up, 0 inactive")
    rows = evaluate_gpu_efa(project, ["n1"], [None], [None], [nvlink.replace("26.562 GB/s", "<inactive>", 1)])
    assert [r.verdict for r in rows] == ["fail", "fail", "fail"]


def test_cli_dry_run_and_bad_input(tmp_path):
    from typer.testing import CliRunner

    from clustertrain.cli.validate import app

    cpu_project(tmp_path)
    path = str(tmp_path / "p.yaml")
    runner = CliRunner()
    dry = runner.invoke(app, ["suite", path, "--dry-run", "--nodes", "2", "--max-bytes", "64K"])
    assert dry.exit_code == 0, dry.output
    assert dry.output.count("#!/bin/bash") == 3 and "# ---- gpu-efa: not applicable: gpus_per_node=0" in dry.output
    assert "# ---- nccl-tests: not applicable: gpus_per_node=0" in dry.output
    assert '"max_bytes": 65536' in dry.output and not (tmp_path / "fsx").exists()  # nothing written
    assert "# ---- config: " + str(tmp_path / "fsx/vs/validation/DRY-RUN/config/collectives.json") in dry.output
    assert "/fsx/vs/validation/DRY-RUN/" in dry.output  # the layout's outputs base
    default = runner.invoke(app, ["suite", path, "--dry-run", "--nodes", "2"])
    assert default.exit_code == 0 and '"max_bytes": 1048576' in default.output  # CPU: a small sweep
    gpu = runner.invoke(app, ["suite", str(EXAMPLE_P5E), "--dry-run", "--nodes", "2", "--set", "launch.max_segments=8"])
    assert gpu.exit_code == 0, gpu.output
    assert '"max_bytes": 1073741824' in gpu.output and "export NCCL_DEBUG=INFO" in gpu.output
    off = runner.invoke(app, ["suite", str(EXAMPLE_P5E), "--dry-run", "--set", "storage.outputs=/home/u/out"])
    assert off.exit_code == 2 and off.output.count("\n") == 1 and "storage.outputs: /home/u/out" in off.output
    for args, msg in ((["--nodes", "two"], "give a node count"), (["--engine", "dd"], "'dd' is not one of 'auto', 'fio', 'python'"),
                      (["--min-bytes", "1M", "--max-bytes", "1K"], "below min_bytes"),
                      (["--inject-fault", "absent"], "fault must look like"), (["--set", "cluster.nodes=0"], "cluster.nodes")):
        res = runner.invoke(app, ["suite", path, "--dry-run", *args])
        assert res.exit_code == 2 and msg in res.output and "Traceback" not in res.output, (args, res.output)
