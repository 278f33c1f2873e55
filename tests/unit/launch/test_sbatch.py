"""Rendering of the Slurm batch script: golden files, quoting of hostile names, what is (not) rendered.

Golden files live in golden/; regenerate them after an intended change with
``CLUSTERTRAIN_UPDATE_GOLDEN=1 pytest tests/unit/launch/test_sbatch.py`` and review the diff.
The container variant cannot run here (Pyxis is not installable), so the golden file is its check;
the host variant also runs for real in tests/integration/launch/test_slurm_backend.py.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import ValidationError

from clustertrain.core.errors import LaunchError
from clustertrain.launch.config import LaunchConfig
from clustertrain.launch.sbatch import build_request, render_script, sbatch_quote, srun_command
from clustertrain.project import validate_project
from tests.support import golden

GOLDEN = Path(__file__).parent / "golden"
HOSTILE_NAME = "x'; touch INJECTED; echo '"
HOSTILE_PARTS = ["a 0", 'a"=0"', "a'; touch INJECTED; echo foo", "$(touch INJECTED)", "a#b%x"]


def project(**cluster):
    base = {"backend": "slurm", "nodes": 2, "gpus_per_node": 0, "procs_per_node": 1}
    cluster = {**base, **cluster}
    if cluster["gpus_per_node"]:
        del cluster["procs_per_node"]
    world = cluster["nodes"] * (cluster["gpus_per_node"] or 1)
    return validate_project({
        "name": "proj", "cluster": cluster, "storage": {"root": "/fsx"},
        "models": [{"name": "m1", "model": {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 64},
                    "training": {"max_steps": 10, "micro_batch": 8, "global_batch": 8 * world}}],
    })


def golden_text(request) -> str:
    return render_script(replace(request, version="0.0.0-golden"))  # a release bump does not change the golden files


def check_golden(name: str, text: str) -> None:
    golden.check_golden(GOLDEN / name, text)


def test_golden_container_p5e():
    p = project(nodes=2, gpus_per_node=8, instance_type="p5e.48xlarge", container_image="/fsx/images/train.sqsh",
                partition="gpu", time_limit="48:00:00", cpus_per_task=12)
    launch = LaunchConfig(env={"NCCL_DEBUG": "WARN", "MY_FLAG": "a b"}, sbatch_args=["--qos=high"],
                          srun_args=["--cpu-bind=none"])
    req = build_request(p, p.models[0], Path("/fsx/proj/m1"), launch=launch,
                        submit_command="clustertrain submit proj.yaml --model m1")
    text = golden_text(req)
    check_golden("sbatch_container_p5e.sh", text)
    assert "--container-image=/fsx/images/train.sqsh" in text
    assert "--container-mounts=/fsx:/fsx " in text  # no device bind: Enroot binds /dev, /dev/infiniband included
    # HOME and the caches under it off the read-only image, onto the mounted cache root, kept by --container-env
    user = __import__("getpass").getuser()
    assert f"export HOME=/fsx/proj/m1/cache/{user}/home" in text
    assert f"export TRITON_CACHE_DIR=/fsx/proj/m1/cache/{user}/triton" in text
    assert ",HOME,XDG_CACHE_HOME,TRITON_CACHE_DIR,TORCHINDUCTOR_CACHE_DIR,CUDA_CACHE_PATH," in text
    assert "--container-workdir=/fsx/proj/m1 --no-container-mount-home --cpu-bind=none python -m clustertrain train" in text
    assert sys.executable not in text


def test_golden_host_large_p5_gres():
    p = project(nodes=16, gpus_per_node=8, instance_type="p5.48xlarge")
    req = build_request(p, p.models[0], Path("/fsx/proj/m1"), python="/opt/venv/bin/python",
                        launch=LaunchConfig(gpu_directive="gres", exclusive=False, max_restarts=5, signal_grace_s=120),
                        submit_command="clustertrain submit proj.yaml")
    text = golden_text(req)
    check_golden("sbatch_host_p5_large.sh", text)
    assert "#SBATCH --gres=gpu:8" in text and "--gpus-per-node" not in text
    assert "#SBATCH --exclusive" not in text and "container" not in text
    assert "export NCCL_DEBUG=WARN" in text and "#SBATCH --signal=B:USR2@120" in text


def test_defaults_use_this_python_and_log_root_per_model():
    p = project()
    text = render_script(build_request(p, p.models[0], Path("/fsx/proj/m1")))
    assert f" {shlex.quote(sys.executable)} -m clustertrain train --run-dir /fsx/proj/m1 --model m1 &" in text
    assert '#SBATCH --output="/fsx/proj/logs/m1/%x-%j.out"' in text
    for line in ("#SBATCH --open-mode=append", "#SBATCH --requeue", "#SBATCH --signal=B:USR2@300", "#SBATCH --exclusive",
                 '#SBATCH --job-name="proj-m1"', "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1"):
        assert line in text.splitlines()
    assert "srun --kill-on-bad-exit=1" in text
    assert "export FI_PROVIDER" not in text  # no instance type, no preset
    assert "--container" not in text and "gpus-per-node" not in text


def test_sbatch_quote_escapes_what_sbatch_parses():
    assert sbatch_quote("plain") == '"plain"'
    assert sbatch_quote('a"b#c\\d e') == '"a\\"b\\#c\\\\d e"'
    assert sbatch_quote("x'; touch INJECTED; echo '") == "\"x'; touch INJECTED; echo '\""


@pytest.mark.parametrize("field,value", [("job_name", "a\nb"), ("job_name", "a\0b"), ("job_name", "a/b"),
                                         ("run_dir", "/fsx/a\nb"), ("submit_command", "x\r\ny")])
def test_newlines_nuls_and_slashes_are_rejected(field, value):
    p = project()
    kwargs = {"job_name": None, "submit_command": None, field: value}
    run_dir = kwargs.pop("run_dir", "/fsx/ok")
    with pytest.raises(LaunchError, match="newline or NUL|no '/'"):
        build_request(p, p.models[0], Path(run_dir), **kwargs)


def test_launch_config_rejects_bad_env_and_args():
    with pytest.raises(ValidationError, match="newline or NUL"):
        LaunchConfig(env={"A": "x\ny"})
    with pytest.raises(ValidationError, match="not a valid environment variable name"):
        LaunchConfig(env={"A B": "x"})
    with pytest.raises(ValidationError, match="must be an option"):
        LaunchConfig(srun_args=["rm -rf /"])
    with pytest.raises(ValidationError):
        LaunchConfig(signal="KILL")
    with pytest.raises(ValidationError):
        LaunchConfig(surprise=1)


def test_container_mounts_with_commas_are_refused():
    p = project(container_image="img.sqsh")
    with pytest.raises(LaunchError, match="--container-mounts"):
        build_request(p, p.models[0], Path("/elsewhere/a,b"))


def test_hostile_names_reach_srun_as_single_words(tmp_path):
    """Run the rendered script under bash with recording stand-ins for srun/scontrol (a unit test of the
    quoting only; the real Slurm run of a hostile job is in the integration tests): every argument
    arrives intact and nothing in the names is executed."""
    hostile_dir = tmp_path.joinpath(*HOSTILE_PARTS)
    p = project()
    req = build_request(p, p.models[0], hostile_dir, job_name=HOSTILE_NAME,
                        launch=LaunchConfig(env={"WEIRD": "$(touch INJECTED) `touch INJECTED` ' \" \\"}))
    script = tmp_path / "job.sh"
    script.write_text(render_script(req))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "argv.txt"
    (bin_dir / "srun").write_text(f'#!/bin/bash\nprintf "%s\\0" "$@" > {shlex.quote(str(record))}\n'
                                  f'printf "%s" "$WEIRD" > {shlex.quote(str(tmp_path / "weird.txt"))}\n')
    (bin_dir / "scontrol").write_text("#!/bin/bash\nif [ \"$2\" = hostnames ]; then echo node1; "
                                      "else echo 'NodeName=node1 Arch=x NodeAddr=10.0.0.7 NodeHostName=h'; fi\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "1234",
           "SLURM_JOB_NODELIST": "node1"}
    proc = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert "master 10.0.0.7:21234" in proc.stdout
    argv = record.read_bytes().decode().split("\0")[:-1]
    assert argv == srun_command(req)[1:]
    assert argv[argv.index("--run-dir") + 1] == str(hostile_dir)
    assert (tmp_path / "weird.txt").read_text() == "$(touch INJECTED) `touch INJECTED` ' \" \\"
    assert not list(tmp_path.rglob("INJECTED")) and not Path("INJECTED").exists()
    header = [ln for ln in script.read_text().splitlines() if ln.startswith("#SBATCH --job-name=")]
    assert header == ["#SBATCH --job-name=\"x'; touch INJECTED; echo '\""]


def test_stop_signal_and_restart_budget_are_rendered():
    p = project()
    text = render_script(build_request(p, p.models[0], Path("/fsx/r"), launch=LaunchConfig(signal="TERM", max_restarts=0)))
    assert "#SBATCH --signal=B:TERM@300" in text and "trap forward_stop TERM" in text
    assert "MAX_RESTARTS=0" in text and 'scontrol requeue "$SLURM_JOB_ID"' in text
    proc = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_cli_dry_run_prints_the_script_and_touches_nothing(tmp_path):
    import typer
    from typer.testing import CliRunner

    from clustertrain.cli import jobs

    app = typer.Typer()
    jobs.register(app)
    path = tmp_path / "p.yaml"
    path.write_text(
        "name: dry\ncluster: {backend: slurm, nodes: 2, procs_per_node: 1}\n"
        f"storage: {{root: {str(tmp_path / 'fsx')!r}}}\n"
        "models:\n- {name: a, model: {layers: 2, hidden: 64, heads: 4, seq_len: 64}, training: {max_steps: 5}}\n"
        "- {name: b, model: {layers: 2, hidden: 64, heads: 4, seq_len: 64}, training: {max_steps: 5}}\n")
    res = CliRunner().invoke(app, ["submit", str(path), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert res.output.count("#!/bin/bash\n# Generated by clustertrain") == 2  # one job per model
    assert '#SBATCH --job-name="dry-a"' in res.output and '#SBATCH --job-name="dry-b"' in res.output
    assert f"--run-dir {tmp_path / 'fsx' / 'dry' / 'a'} --model a" in res.output
    assert not (tmp_path / "fsx").exists()


def test_each_model_runs_on_the_plans_node_count_not_cluster_nodes():
    """Issue 12 item 3: with plan.cluster_nodes, the planner's allocation is the job size (here 6 x 11 + 1 x 14)."""
    models = [{"name": f"model-{i}", "model": {"layers": 24, "hidden": 2048, "heads": 16, "seq_len": 4096, "vocab": 32000},
               "training": {"max_steps": 10, "micro_batch": 1, "global_batch": 1232},
               "plan": {"tokens": 127_000_000_000 if i == 7 else 100_000_000_000}} for i in range(1, 8)]
    p = validate_project({"name": "fleet", "cluster": {"backend": "slurm", "nodes": 11, "gpus_per_node": 8,
                                                       "instance_type": "p5e.48xlarge"},
                          "storage": {"root": "/fsx"}, "plan": {"cluster_nodes": 80, "assumed_mfu": 0.4}, "models": models})
    text = render_script(build_request(p, p.models[6], Path("/fsx/fleet/model-7")))
    assert "#SBATCH --nodes=14\n" in text and "srun --kill-on-bad-exit=1 --nodes=14 " in text
    assert "#SBATCH --nodes=11\n" in render_script(build_request(p, p.models[0], Path("/fsx/fleet/model-1")))


def test_every_script_waits_for_all_nodes_and_records_its_end():
    text = render_script(build_request(project(), project().models[0], Path("/r")))
    assert "#SBATCH --wait-all-nodes=1\n" in text
    assert 'END_MARKER="$JOBS_DIR/$SLURM_JOB_ID.end"' in text and "record_end COMPLETED 0" in text
    assert "trap on_term TERM" in text and "unset RANK WORLD_SIZE LOCAL_RANK" in text
    term = render_script(build_request(project(), project().models[0], Path("/r"), launch=LaunchConfig(signal="TERM")))
    assert "trap on_term TERM" not in term and "trap forward_stop TERM" in term


def test_container_gets_the_rank_variables_by_name_and_keeps_its_library_path():
    p = project(nodes=2, gpus_per_node=8, instance_type="p5e.48xlarge", container_image="/fsx/img.sqsh")
    req = build_request(p, p.models[0], Path("/fsx/proj/m1"), launch=LaunchConfig(env={"MY_FLAG": "1"}))
    argv = srun_command(req)
    [env_arg] = [a for a in argv if a.startswith("--container-env=")]
    names = env_arg.split("=", 1)[1].split(",")
    assert names[:6] == ["MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_JOB_ID"]
    assert {"NCCL_SOCKET_IFNAME", "NCCL_DEBUG", "MY_FLAG", "PYTHONUNBUFFERED"} <= set(names)
    assert "LD_LIBRARY_PATH" not in names and "LD_LIBRARY_PATH" not in render_script(req)
    assert argv.index(env_arg) < argv.index("python")
    host = build_request(project(nodes=2, gpus_per_node=8, instance_type="p5e.48xlarge"), p.models[0], Path("/r"))
    assert not any(a.startswith("--container") for a in srun_command(host))


def test_python_comes_from_launch_python_and_library_dirs_from_aws_os():
    from clustertrain.resolve import load_project

    root = Path(__file__).resolve().parents[3]
    p = load_project(root / "examples" / "p5e-80x7.yaml", ["launch.python=/fsx/data/envs/t/bin/python",
                                                               "image=null"])
    text = render_script(build_request(p, p.models[0], Path("/fsx/checkpoints/p5e-80x7/model-1"), nodes=11))
    assert "/fsx/data/envs/t/bin/python -m clustertrain train" in text and sys.executable not in text
    assert "export LD_LIBRARY_PATH=/opt/amazon/efa/lib64:/opt/amazon/ofi-nccl/lib64" in text
    for gone in ("NCCL_TUNER_PLUGIN", "FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA", "FI_EFA_FORK_SAFE", "NCCL_BUFFSIZE",
                 "NCCL_P2P_NET_CHUNKSIZE", "x86_64-linux-gnu"):
        assert gone not in text, gone
    ubuntu = load_project(root / "examples" / "p5e-80x7.yaml", ["aws.os=ubuntu2204", "image=null"])
    text = render_script(build_request(ubuntu, ubuntu.models[0], Path("/fsx/checkpoints/x"), nodes=11))
    assert "export LD_LIBRARY_PATH=/opt/amazon/efa/lib:/opt/amazon/ofi-nccl/lib\"" in text


def fake_slurm_bin(tmp_path: Path, srun_body: str, hosts: list[str]) -> Path:
    """Stand-ins for the Slurm clients a batch script calls: ``srun`` runs ``srun_body``; ``scontrol`` prints
    ``hosts`` for ``show hostnames``, a node line whose NodeAddr is the node's name, and records ``requeue``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/bash\n" + srun_body)
    calls = shlex.quote(str(tmp_path / "scontrol.calls"))
    (bin_dir / "scontrol").write_text(
        f'#!/bin/bash\necho "$*" >> {calls}\n'
        f'case "$1 $2" in\n  "show hostnames") printf "%s\\n" {" ".join(hosts)} ;;\n'
        '  "show node") echo "NodeName=$3 Arch=x86_64 NodeAddr=$3 NodeHostName=$3" ;;\nesac\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return bin_dir


def test_train_validate_and_the_batch_script_agree_on_the_ranks(tmp_path):
    """Issue 13 defect 2: for one Slurm job, what a rank derives in training (train.distributed), in validation
    (validate.collectives.job_env) and what the rendered batch script exports agree. (Before clustertrain.core.ranks,
    validation used job id % 20000: port 31337 here, against 21337 in the trainer and the script.)"""
    from clustertrain.core.ranks import RankInfo
    from clustertrain.validate.collectives import job_env

    job = {"SLURM_JOB_ID": "31337", "SLURM_JOB_NODELIST": "trn-st-p5-[07-08]", "SLURM_NTASKS": "16",
           "SLURM_TASKS_PER_NODE": "8(x2)"}
    task = {"SLURM_PROCID": "9", "SLURM_LOCALID": "1", "SLURM_NODEID": "1"}  # what srun adds for one task
    p = project(nodes=2, gpus_per_node=8)
    script = tmp_path / "job.sh"
    script.write_text(render_script(build_request(p, p.models[0], tmp_path / "run")))
    dump = shlex.quote(str(tmp_path / "srun.env"))
    bin_dir = fake_slurm_bin(tmp_path, f"env -0 > {dump}\n", ["trn-st-p5-07", "trn-st-p5-08"])
    stale = {"RANK": "5", "WORLD_SIZE": "99", "LOCAL_RANK": "5", "LOCAL_WORLD_SIZE": "99", "MASTER_PORT": "1",
             "MASTER_ADDR": "elsewhere"}  # exported by the submitting shell; sbatch passes them on
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", **job, **stale}
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    exported = dict(item.split("=", 1) for item in (tmp_path / "srun.env").read_text().split("\0") if item)
    assert not {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"} & set(exported)

    def view(info):
        return info.master_addr, info.master_port, info.rank, info.world_size, info.local_rank

    expected = ("trn-st-p5-07", 21337, 9, 16, 1)
    assert (exported["MASTER_ADDR"], int(exported["MASTER_PORT"])) == expected[:2]
    for derive in (RankInfo.from_environ, job_env):
        assert view(derive({**exported, **task})) == expected  # a rank started by this script
        assert view(derive({**job, **task})) == expected  # a rank started by srun with no batch script around it


@pytest.mark.parametrize("completed", [True, False])
def test_stopped_job_is_requeued_unless_training_completed(tmp_path, completed):
    """The requeue decision of the rendered script, run by bash: srun's ranks get the stop signal and exit 0;
    the job is requeued only when the run directory has no COMPLETED marker (clustertrain.core.run_paths)."""
    from clustertrain.core.run_paths import RunPaths

    p = project()
    run = tmp_path / "run 'x' $(touch INJECTED)"
    req = build_request(p, p.models[0], run, launch=LaunchConfig(max_restarts=2))
    script = tmp_path / "job.sh"
    script.write_text(render_script(req))
    run.mkdir()
    (run / "status.json").write_text('{"state": "completed"}')  # what decided before: no longer read
    if completed:
        RunPaths(run).completed.touch()
    # the ranks: stop the batch shell as Slurm's --signal would, then exit 0 on the forwarded signal
    bin_dir = fake_slurm_bin(tmp_path, "trap 'exit 0' USR2\nkill -USR2 $PPID\nfor _ in $(seq 300); do sleep 0.1; done\nexit 3\n", ["node1"])
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node1"}
    proc = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    requeued = "requeue 42" in (tmp_path / "scontrol.calls").read_text().splitlines()
    assert requeued == (not completed), proc.stdout
    assert ("nothing to resume" in proc.stdout) == completed
    assert not list(tmp_path.rglob("INJECTED"))


def test_dry_run_for_the_local_slurm_shows_the_ranks_in_the_container_view(tmp_path, monkeypatch):
    """SLURM_CONF naming a clustertrain local cluster (slurm.conf beside cluster.json; no Slurm started): the dry run
    prints the script that cluster would get — no Pyxis option on srun, the ranks behind the stand-in view."""
    from clustertrain.launch.slurm import SlurmLauncher, submit_project
    from clustertrain.launch.slurm_cluster_paths import LocalSlurmPaths

    state = LocalSlurmPaths(tmp_path / "local-slurm")
    state.root.mkdir()
    state.conf.write_text("# stand-in: only its place is read here\n")
    state.write_record({"nodes": 2})
    image = tmp_path / "fsx" / "images" / "x.sqsh"
    image.parent.mkdir(parents=True)
    image.write_text("stand-in image\n")
    p = validate_project({
        "name": "proj", "cluster": {"backend": "slurm", "nodes": 2, "gpus_per_node": 0, "procs_per_node": 1,
                                    "container_image": str(image)},
        "storage": {"root": str(tmp_path / "fsx")},
        "models": [{"name": "m1", "model": {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 64},
                    "training": {"max_steps": 10, "micro_batch": 8, "global_batch": 16}}]})
    [plain] = submit_project(p, None, None, False, SlurmLauncher(env={"SLURM_CONF": "/nonexistent/slurm.conf"}), dry_run=True)
    [local] = submit_project(p, None, None, False, SlurmLauncher(env={"SLURM_CONF": str(state.conf)}), dry_run=True)
    pyxis = next(ln for ln in plain.script.splitlines() if ln.startswith("srun "))
    view = next(ln for ln in local.script.splitlines() if ln.startswith("srun "))
    assert "container_view" not in pyxis and f"srun --kill-on-bad-exit=1 --nodes=2 --ntasks-per-node=1 --container-image={image}" in pyxis
    assert view.index("-m clustertrain.launch.container_view") < view.index(f"--container-image={image}") < view.index(" -- ")


# ----- a job on a share of one node (issue 42: models[].plan.gpus) -----

def shared_project(gpus: int = 4, **cluster):
    """Two models on p5e.48xlarge: ``whole`` on cluster.nodes whole nodes, ``half`` on a ``gpus``-GPU share of one."""
    cl = {"backend": "slurm", "nodes": 2, "gpus_per_node": 8, "instance_type": "p5e.48xlarge", "partition": "gpu",
          **cluster}
    model = {"model": {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 64}}
    return validate_project({
        "name": "proj", "cluster": cl, "storage": {"root": "/fsx"},
        "models": [{"name": "whole", **model, "training": {"max_steps": 10, "micro_batch": 8, "global_batch": 8 * 16}},
                   {"name": "half", **model, "training": {"max_steps": 10, "micro_batch": 8, "global_batch": 8 * gpus},
                    "plan": {"gpus": gpus}}],
    })


def directives(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("#SBATCH ")]


def test_golden_shared_node_job_and_its_whole_node_neighbour():
    from clustertrain.plan.packing import job_share

    p = shared_project()
    half, whole = p.model("half"), p.model("whole")
    share = job_share(p, half)
    assert share is not None and (share.gpus, share.cpus_per_gpu) == (4, 24)  # p5e.48xlarge: 192 vCPUs / 8 GPUs
    assert share.mem_mb == int(2048 * 1024 * 0.95) * 4 // 8  # ParallelCluster's RealMemory (95 %) in proportion
    req = build_request(p, half, Path("/fsx/proj/half"), python="/opt/venv/bin/python",
                        submit_command="clustertrain submit proj.yaml --model half")
    text = golden_text(req)
    check_golden("sbatch_shared_node_p5e.sh", text)
    lines = directives(text)
    for line in ("#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=4", "#SBATCH --gpus-per-node=4",
                 "#SBATCH --cpus-per-gpu=24", f"#SBATCH --mem={share.mem_mb}M"):
        assert line in lines, line
    assert "#SBATCH --exclusive" not in lines and not any(a.startswith("#SBATCH --cpus-per-task") for a in lines)
    # the trainer's world is the share: 1 node x 4 tasks; no --cpus-per-task on srun (the step inherits cpus-per-gpu)
    assert "srun --kill-on-bad-exit=1 --nodes=1 --ntasks-per-node=4 --cpu-bind=none " in text
    # NCCL within one node: no EFA layer (no socket interface rules, no libfabric/aws-ofi-nccl directories)
    assert req.env.scale == "within_node" and req.env.efa is False
    assert "NCCL_SOCKET_IFNAME" not in text and "GLOO_SOCKET_IFNAME" not in text and "FI_" not in text
    # the whole-node model of the same project keeps --exclusive and its EFA preset
    wtext = render_script(build_request(p, whole, Path("/fsx/proj/whole"), python="/opt/venv/bin/python"))
    wlines = directives(wtext)
    assert "#SBATCH --exclusive" in wlines and "#SBATCH --nodes=2" in wlines and "#SBATCH --ntasks-per-node=8" in wlines
    assert not any(a.startswith(("#SBATCH --mem", "#SBATCH --cpus-per-gpu")) for a in wlines)
    assert "export NCCL_SOCKET_IFNAME='^docker,lo,veth'" in wtext


def test_shared_node_job_with_cpus_per_task_and_gres_never_asks_cpus_per_gpu():
    p = shared_project(gpus=2, cpus_per_task=12)
    req = build_request(p, p.model("half"), Path("/fsx/proj/half"), python="/opt/venv/bin/python",
                        launch=LaunchConfig(gpu_directive="gres", exclusive=True))
    lines = directives(render_script(req))
    assert "#SBATCH --gres=gpu:2" in lines and "#SBATCH --cpus-per-task=12" in lines
    assert not any(a.startswith("#SBATCH --cpus-per-gpu") for a in lines)  # sbatch refuses both together
    assert "#SBATCH --exclusive" not in lines  # launch.exclusive applies to whole-node jobs only
    assert "--cpus-per-task=12" in srun_command(req)  # 22.05+: srun does not inherit it


def test_shared_node_job_outside_the_catalog_asks_no_memory_or_cpus():
    p = shared_project(instance_type=None)
    req = build_request(p, p.model("half"), Path("/fsx/proj/half"), python="/opt/venv/bin/python")
    lines = directives(render_script(req))
    assert "#SBATCH --gpus-per-node=4" in lines and "#SBATCH --nodes=1" in lines
    assert not any(a.startswith(("#SBATCH --mem", "#SBATCH --cpus-per-gpu", "#SBATCH --exclusive")) for a in lines)


def test_shared_node_job_of_cpu_workers_asks_cpus_per_task():
    p = validate_project({
        "name": "proj", "cluster": {"backend": "slurm", "nodes": 1, "gpus_per_node": 0, "procs_per_node": 4,
                                    "instance_type": "c6i.4xlarge"},
        "storage": {"root": "/fsx"},
        "models": [{"name": "m", "model": {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 64},
                    "training": {"max_steps": 10, "micro_batch": 8, "global_batch": 16}, "plan": {"gpus": 2}}],
    })
    req = build_request(p, p.models[0], Path("/fsx/proj/m"), python="/opt/venv/bin/python")
    lines = directives(render_script(req))
    assert "#SBATCH --ntasks-per-node=2" in lines and "#SBATCH --nodes=1" in lines
    assert not any("gpu" in a or a.startswith("#SBATCH --exclusive") for a in lines)
    # the planner's catalog holds GPU types only: with one that knows the CPUs, rank slots get --cpus-per-task
    from clustertrain.launch.sbatch import share_fields
    from clustertrain.plan.packing import JobShare

    fields = share_fields(0, None, JobShare(2, 15564, 4))
    assert (fields["cpus_per_task"], fields["cpus_per_gpu"], fields["gpus_per_node"], fields["mem_mb"]) == (4, None, 0, 15564)
