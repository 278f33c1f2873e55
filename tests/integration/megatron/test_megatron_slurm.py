"""A Megatron-LM model's job on the real local Slurm cluster (2 emulated nodes with 2 emulated GPUs each).

Real Megatron-LM needs CUDA GPUs, so ``megatron.path`` points at a stand-in ``pretrain_gpt.py`` (a double for
Megatron only; sbatch, srun, the batch script, the rank wrapper, the rendezvous variables and the backup step
are the real ones). The stand-in records its argv and environment per rank, rank 0 writes Megatron's checkpoint
layout (``iter_<N>/`` + ``latest_checkpointed_iteration.txt``) and the last rank prints iteration lines in the
format of ``training_log`` at core_v0.16.1.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from clustertrain.launch.config import LaunchConfig
from clustertrain.core.job_records import read_records
from clustertrain.launch.slurm import SlurmLauncher, submit_project
from clustertrain.resolve import load_project
from clustertrain.core.ranks import port_for_job
from clustertrain.core.run_paths import RunPaths
from tests.support.slurm import local_slurm_cluster

pytestmark = pytest.mark.slow

STANDIN = textwrap.dedent('''
    """Stand-in for Megatron-LM's pretrain_gpt.py (tests only): records argv and rank variables."""
    import json, os, socket, sys
    from datetime import datetime
    from pathlib import Path
    here = Path(__file__).resolve().parent
    argv = sys.argv[1:]
    opt = lambda name: argv[argv.index(name) + 1]
    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
            "CUDA_DEVICE_MAX_CONNECTIONS", "SLURMD_NODENAME", "SLURM_PROCID", "NCCL_DEBUG")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    (here / "records").mkdir(exist_ok=True)
    (here / "records" / f"rank{rank}.json").write_text(json.dumps(
        {"argv": argv, "executable": sys.executable, "script": __file__, "env": {k: os.environ.get(k) for k in keys}}))
    iters, gbs, every = int(opt("--train-iters")), int(opt("--global-batch-size")), int(opt("--log-interval"))
    if rank == world - 1:
        for it in range(every, iters + 1, every):
            print(f" [{datetime.now().strftime('%Y-%m-%d %H:%M:%S.%f')}] iteration {it:8d}/{iters:8d} |"
                  f" consumed samples: {it * gbs:12d} | elapsed time per iteration (ms): 250.0 |"
                  f" throughput per GPU (TFLOP/s/GPU): 1.0 | learning rate: {3e-4:.6E} | global batch size: {gbs:5d} |"
                  f" lm loss: {5.0 - it / iters:.6E} | loss scale: 1.0 | grad norm: 1.000 |"
                  f" number of skipped iterations:   0 | number of nan iterations:   0 |", flush=True)
    if rank == 0:
        save = Path(opt("--save"))
        (save / f"iter_{iters:07d}").mkdir(parents=True, exist_ok=True)
        (save / f"iter_{iters:07d}" / "common.pt").write_bytes(b"stand-in checkpoint " * 100)
        (save / "latest_checkpointed_iteration.txt").write_text(str(iters))
''')


@pytest.fixture(scope="module")
def gpu_slurm(tmp_path_factory):
    yield from local_slurm_cluster(tmp_path_factory.mktemp("slurm-mg"), nodes=2, gpus_per_node=2)


def test_megatron_job_runs_the_rendered_command_with_rank_variables_for_2x2(gpu_slurm, tmp_path):
    standin = tmp_path / "megatron-lm"
    standin.mkdir()
    (standin / "pretrain_gpt.py").write_text(STANDIN)
    bucket = tmp_path / "bucket"
    project_file = tmp_path / "mg.yaml"
    project_file.write_text(textwrap.dedent(f"""
        name: mg
        cluster: {{backend: slurm, nodes: 2, gpus_per_node: 2, time_limit: "30:00"}}
        storage: {{root: {tmp_path / 'fsx'}, checkpoint_bucket: {bucket}}}
        models:
          - name: tiny
            framework: megatron
            megatron: {{path: {standin}, transformer_impl: local}}
            model: {{layers: 2, hidden: 64, heads: 4, seq_len: 64}}
            data: {{source: "builtin:shakespeare", tokenizer: byte}}
            training: {{max_steps: 4, micro_batch: 1, global_batch: 8, log_every: 2, checkpoint_every: 2}}
            parallelism: {{tp: 2, zero_stage: 1}}
    """))
    project = load_project(project_file)
    slurm = SlurmLauncher(env=gpu_slurm.env(), launch=LaunchConfig(exclusive=False))
    [sub] = submit_project(project, None, None, resume=True, launcher=slurm)
    final = slurm.wait(sub.job_id, timeout=120)
    out = "\n".join(list(slurm.logs(sub.job_id))[-30:])
    assert (final.state, final.exit_code) == ("COMPLETED", 0), out

    records = {int(p.stem.removeprefix("rank")): json.loads(p.read_text()) for p in (standin / "records").glob("rank*.json")}
    assert sorted(records) == [0, 1, 2, 3]
    port = str(port_for_job(sub.job_id))
    for rank, rec in records.items():
        env = rec["env"]
        assert env["RANK"] == env["SLURM_PROCID"] == str(rank)
        assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == ("4", "2")
        assert env["LOCAL_RANK"] == str(rank % 2) and env["GROUP_RANK"] == str(rank // 2)  # block distribution
        assert env["SLURMD_NODENAME"] == f"node{rank // 2 + 1}"
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", port)
        assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"  # tp 2
        assert rec["script"] == str(standin / "pretrain_gpt.py")
    argv = records[0]["argv"]
    assert all(r["argv"] == argv for r in records.values())
    # the command the job ran is the one the batch script shows (and submit --dry-run prints)
    assert " ".join(argv[:6]) in Path(sub.script).read_text()
    assert argv[argv.index("--tensor-model-parallel-size") + 1] == "2" and "--use-distributed-optimizer" in argv
    run = RunPaths(sub.run_dir)
    assert argv[argv.index("--save") + 1] == str(run.checkpoints)
    prefix = Path(argv[argv.index("--data-path") + 1])
    assert prefix.with_suffix(".bin").is_file() and prefix.with_suffix(".idx").is_file()  # staged by submit

    # completion from Megatron's own checkpoint layout, then the final checkpoint's backup, verified
    assert run.completed.is_file()
    copy = bucket / "mg" / "tiny" / "iter_0000004"
    assert (copy / "latest_checkpointed_iteration.txt").read_text().strip() == "4"
    assert (copy / "iter_0000004" / "common.pt").read_bytes() == (run.checkpoints / "iter_0000004" / "common.pt").read_bytes()
    assert "final checkpoint backed up to" in out
    [record] = read_records(run)
    assert (record.state, record.exit_code) == ("COMPLETED", 0)

    # the last rank's iteration lines in the job output become metrics rows (what `clustertrain status` shows)
    from clustertrain.megatron.logs import ingest_megatron_log, log_sources
    from clustertrain.train.metrics import read_metrics

    assert ingest_megatron_log(run, project.models[0], project, log_sources(run)) == 2
    rows = read_metrics(run.metrics)
    assert [(r["step"], r["loss"]) for r in rows] == [(2, 4.5), (4, 4.0)]
    assert rows[-1]["tokens_per_s"] == pytest.approx(8 * 64 / 0.25)
