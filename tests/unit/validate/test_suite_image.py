"""The validation suite runs in the project's image (issue 37 item 5): every smoke, collectives, nccl-tests and
storage step carries training's Pyxis options (asserted on the rendered srun lines, run through bash), the
gpu-efa host scan carries none, the interpreter is the image's, the storage bench writes in the project's own
directory on each mount, and a project whose image is missing (or a GPU project without one) is refused in one
line before anything is printed or written."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from clustertrain.cli.validate import app
from clustertrain.image.paths import image_interpreter, sqsh_path
from clustertrain.launch.sbatch import CONTAINER_NAME
from clustertrain.resolve import load_project
from clustertrain.validate.results import ValidateError
from clustertrain.validate.suite import SuiteConfig, SuitePaths, plan_suite, render_job, require_image, suite_context
from clustertrain.validate.suite_checks import nccl_tests
from clustertrain.validate.suitedir import JobOutcome

EXAMPLE_P5E = Path(__file__).parents[3] / "examples" / "p5e-80x7.yaml"
FIXTURES = Path(__file__).parent / "fixtures"
IMAGE_STEPS = {"smoke": [1, 2], "gpu-efa": [], "collectives": [0], "nccl-tests": [0, 1, 2, 3, 4, 5],
               "storage-1": [0], "storage-2": [0], "storage-3": [0]}
LOCAL = """
name: vi
cluster: {{backend: slurm, nodes: 2, gpus_per_node: {gpus}, procs_per_node: 1}}
storage: {{root: {root}}}
image: {{dir: {images}}}
models:
  - name: tiny
    model: {{layers: 2, hidden: 64, heads: 4, seq_len: 64}}
    training: {{max_steps: 2, micro_batch: 4, global_batch: 8}}
"""
runner = CliRunner()


def srun_lines(script: str) -> list[list[str]]:
    """Every srun line of a rendered script, as bash splits it (srun replaced by a function printing its argv)."""
    out = []
    for line in (ln for ln in script.splitlines() if ln.startswith("srun ")):
        proc = subprocess.run(["bash", "-c", 'srun() { printf "%s\\0" srun "$@"; }\n' + line],
                              capture_output=True, text=True, check=True)
        out.append(proc.stdout.split("\0")[:-1])
    return out


def options(argv: list[str]) -> dict[str, str]:
    return {a.split("=", 1)[0]: a.split("=", 1)[1] if "=" in a else "" for a in argv if a.startswith("--container")
            or a == "--no-container-mount-home"}


def local_project(tmp_path: Path, gpus: int = 0):
    path = tmp_path / "vi.yaml"
    path.write_text(LOCAL.format(gpus=gpus, root=json.dumps(str(tmp_path / "fsx")),
                                 images=json.dumps(str(tmp_path / "images"))))
    return path


def test_every_step_but_the_host_scan_runs_in_the_image_with_trainings_options(tmp_path):
    project = load_project(EXAMPLE_P5E)
    image, python = str(sqsh_path(project)), image_interpreter(project)
    assert project.container_image == image and python
    paths = SuitePaths(Path("/fsx/checkpoints/p5e-80x7/validation/DRY-RUN"))
    jobs, skipped = plan_suite(project, SuiteConfig(nodes=2), paths)
    assert skipped == {} and {j.name for j in jobs} == set(IMAGE_STEPS)
    for job in jobs:
        lines = srun_lines(render_job(job, paths))
        assert lines == [list(s) for s in job.steps]
        for i, argv in enumerate(lines):
            opts = options(argv)
            if i not in IMAGE_STEPS[job.name]:  # the node answers / the host scan: on the bare node
                assert opts == {}, (job.name, i)
                continue
            assert opts["--container-image"] == image and opts["--container-name"] == CONTAINER_NAME
            assert "--no-container-mount-home" in opts and opts["--container-workdir"] == str(job.results_dir)
            mounts = opts["--container-mounts"].split(",")
            assert {"/fsx/data:/fsx/data", "/fsx/checkpoints:/fsx/checkpoints", "/fsx/logs:/fsx/logs"} <= set(mounts)
            names = opts["--container-env"].split(",")
            # the rank wiring, the project's NCCL preset and every variable the script exports keep the host's value
            assert {"MASTER_ADDR", "SLURM_PROCID", "NCCL_SOCKET_IFNAME", "HOME", "PYTHONUNBUFFERED"} <= set(names)
            assert set(job.env.set) <= set(names)
            # the Pyxis options come before the command, which is the image's interpreter or an image binary
            command = argv[argv.index(next(a for a in argv if a.startswith("--error="))) + 1:]
            assert command[0] == python or command[0].endswith("_perf"), command
    by = {j.name: j for j in jobs}
    assert by["smoke"].steps[2][-6:] == ("scan", "--role", "container", "--json", "--instance-type", "p5e.48xlarge")
    # nccl-tests: MPI over PMIx, one binary per op of the sweep, NCCL's INFO log for the transport verdict
    assert [s[-15] for s in by["nccl-tests"].steps] == [f"{op}_perf" for op in
                                                        ("all_reduce", "all_gather", "broadcast", "reduce",
                                                         "reduce_scatter", "alltoall")]
    assert all("--mpi=pmix" in s for s in by["nccl-tests"].steps)
    assert by["nccl-tests"].steps[0][-14:] == ("-b", "8", "-e", str(1 << 30), "-f", "2", "-g", "1", "-c", "1", "-n", "10",
                                               "-w", "5")
    assert by["nccl-tests"].env.set["NCCL_DEBUG"] == "INFO"
    # the storage bench writes in the project's directory on each mount, which the container mounts
    for job in (by["storage-1"], by["storage-2"], by["storage-3"]):
        assert job.target.endswith("/p5e-80x7/validation/storage-bench") and job.steps[0][-4] == job.target


def test_a_cpu_project_without_an_image_stays_on_the_hosts(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(LOCAL.replace("image: {{dir: {images}}}\n", "").format(gpus=0, root=json.dumps(str(tmp_path / "fsx"))))
    project = load_project(path)
    require_image(project)  # no refusal: gpus_per_node 0 keeps the host path
    jobs, _ = plan_suite(project, SuiteConfig(nodes=2), SuitePaths(tmp_path / "s"))
    assert not any(a.startswith("--container") for j in jobs for s in j.steps for a in s)
    assert suite_context(project, SuiteConfig(), SuitePaths(tmp_path / "s")).cfg.python == __import__("sys").executable


def test_missing_image_and_gpu_project_without_image_are_refused_in_one_line(tmp_path):
    project = load_project(local_project(tmp_path))
    sqsh = sqsh_path(project)
    with pytest.raises(ValidateError, match=rf"^image: {sqsh} does not exist \(the image is not built\); build it with "
                                            rf"`clustertrain image build {tmp_path / 'vi.yaml'}`$"):
        plan_suite(project, SuiteConfig(nodes=2), SuitePaths(tmp_path / "s"))
    dry = runner.invoke(app, ["suite", str(tmp_path / "vi.yaml"), "--dry-run"])
    assert dry.exit_code == 2 and dry.output.count("\n") == 1 and "does not exist (the image is not built)" in dry.output
    assert "#!/bin/bash" not in dry.output and not (tmp_path / "fsx").exists()  # nothing printed, nothing written
    gpu = runner.invoke(app, ["suite", str(EXAMPLE_P5E), "--dry-run", "--set", "image=null"])
    assert gpu.exit_code == 2 and gpu.output.count("\n") == 1, gpu.output
    assert "no container image" in gpu.output and "`clustertrain image build " in gpu.output
    other = load_project(local_project(tmp_path), [f"cluster.container_image={tmp_path / 'nccl.sqsh'}"])
    with pytest.raises(ValidateError, match=r"^cluster.container_image: .*nccl.sqsh does not exist; import it"):
        require_image(other)
    # built: the CPU project's steps run in it (the local Slurm has no Pyxis: this is the dry run only)
    sqsh.parent.mkdir(parents=True)
    sqsh.write_bytes(b"hsqs")
    jobs, _ = plan_suite(project, SuiteConfig(nodes=2), SuitePaths(tmp_path / "s"))
    assert f"--container-image={sqsh}" in jobs[0].steps[1] and jobs[0].steps[1][-3] == image_interpreter(project)


def test_nccl_tests_job_judged_on_recorded_output(tmp_path):
    project = load_project(EXAMPLE_P5E)
    ctx = suite_context(project, SuiteConfig(nodes=2), SuitePaths(tmp_path / "s"))
    assert nccl_tests.not_applicable(ctx) is None
    [job] = nccl_tests.plan(ctx)
    job.results_dir.mkdir(parents=True)
    efa = (FIXTURES / "nccl-all_reduce-16rank-efa-srun-prefix.txt").read_text().split("\n", 1)[1]
    (job.results_dir / "all_reduce.txt").write_text(efa)
    rows = nccl_tests.gather(job, JobOutcome(name=job.name, job_id="9", state="COMPLETED", exit_code=0), [], ctx)
    by = {r.check: r for r in rows}
    assert by["all_reduce"].verdict == "pass" and by["all_reduce"].found.endswith("0 wrong, 16 rank(s)")
    assert by["all_gather"].verdict == "fail" and by["all_gather"].found == "no output"  # not run: named
    assert "all_gather.txt is empty or missing" in by["all_gather"].detail
    assert "job COMPLETED, exit 0" in by["all_gather"].detail and "job " not in by["all_reduce"].detail
    # the p5e band judges the image's nccl-tests figures; the transport is read from the same output
    assert (by["all_reduce busbw"].verdict, by["all_reduce busbw"].found) == ("pass", "876.5 GB/s peak")
    assert (by["transport"].job, by["transport"].verdict) == ("nccl-tests", "pass") and "efa" in by["transport"].found
    socket = (FIXTURES / "nccl-all_gather-socket-fallback.txt").read_text().split("\n", 1)[1]
    (job.results_dir / "all_gather.txt").write_text(socket)
    rows = nccl_tests.gather(job, JobOutcome(name=job.name, job_id="9", state="COMPLETED", exit_code=0), [], ctx)
    [transport] = [r for r in rows if r.check == "transport"]
    assert transport.verdict == "fail" and "Socket" in transport.found
    cpu = suite_context(load_project(local_project(tmp_path)), SuiteConfig(nodes=2), SuitePaths(tmp_path / "c"))
    assert nccl_tests.not_applicable(cpu) == "not applicable: gpus_per_node=0"


def test_on_a_slurm_without_pyxis_the_image_steps_run_behind_the_container_view(tmp_path):
    """SLURM_CONF naming a clustertrain local cluster (its state directory: slurm.conf beside cluster.json; no Slurm
    is started here): srun gets no Pyxis option, each image step runs `python -m clustertrain.launch.container_view
    <the same options> -- COMMAND` with this machine's interpreter, as training's ranks do; the host scan stays bare.
    The real run is tests/integration/validate/test_suite_in_view.py."""
    import sys

    from clustertrain.launch.sbatch import view_prefix
    from clustertrain.launch.slurm_cluster_paths import LocalSlurmPaths

    state = LocalSlurmPaths(tmp_path / "local-slurm")
    state.root.mkdir()
    state.conf.write_text("# stand-in for the local cluster's slurm.conf: only its place is read here\n")
    state.write_record({"nodes": 2})
    local = {"SLURM_CONF": str(state.conf)}
    project = load_project(EXAMPLE_P5E)
    paths = SuitePaths(Path("/fsx/checkpoints/p5e-80x7/validation/DRY-RUN"))
    real, _ = plan_suite(project, SuiteConfig(nodes=2), paths, env={"SLURM_CONF": str(tmp_path / "slurm.conf")})
    jobs, skipped = plan_suite(project, SuiteConfig(nodes=2), paths, env=local)
    assert skipped == {} and [j.name for j in jobs] == [j.name for j in real]
    view = list(view_prefix(sys.executable))
    for job, pyxis in zip(jobs, real):
        for i, (argv, under_pyxis) in enumerate(zip(srun_lines(render_job(job, paths)), pyxis.steps)):
            if i not in IMAGE_STEPS[job.name]:
                assert argv == list(under_pyxis) and "clustertrain.launch.container_view" not in argv, (job.name, i)
                continue
            at = argv.index(view[0])
            assert options(argv[:at]) == {}, argv  # srun itself gets no Pyxis option
            cut = argv.index("--", at)
            assert argv[at:at + len(view)] == view and options(argv[at + len(view):cut]) == options(under_pyxis)
            command = argv[cut + 1:]
            assert command[0] == sys.executable or command[0].endswith("_perf"), command
            assert command[1:] == list(under_pyxis[-len(command) + 1:]), (command, under_pyxis)
    # the CLI's dry run reads SLURM_CONF from the environment: a built CPU project shows its steps in the view
    path = local_project(tmp_path)
    sqsh = sqsh_path(load_project(path))
    sqsh.parent.mkdir(parents=True)
    sqsh.write_bytes(b"hsqs")
    dry = runner.invoke(app, ["suite", str(path), "--dry-run"], env=local)
    assert dry.exit_code == 0, dry.output
    assert dry.output.count("clustertrain.launch.container_view") == 4  # smoke x2, collectives, storage
    assert "srun --nodes=2 --ntasks-per-node=1 --container-image" not in dry.output
