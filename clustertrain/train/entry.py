"""The per-rank entry point: ``python -m clustertrain train --run-dir DIR --model NAME``.

The same entry point runs under the local launcher (RANK/WORLD_SIZE/... set by it), under
torchrun, and under ``srun`` (SLURM_PROCID/SLURM_NTASKS/...). It reads ``RUN_DIR/config.yaml``
(written by the launcher; read leniently, with the version check of
:func:`clustertrain.core.run_records.read_resolved_config`), pins the local GPU when there is one, starts the
node sampler on each node's first rank (:mod:`clustertrain.monitor.sampler`: inside the same container and
step as the ranks, so it sees their GPUs and ends with them), trains, and ends with a barrier and
``destroy_process_group`` (not after a failure: see below). Fault injection: :mod:`clustertrain.train.hooks`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from clustertrain.core.errors import ClusterTrainError, ConfigError
from clustertrain.project import Project
from clustertrain.core.run_paths import RunPaths
from clustertrain.core.run_records import UNKNOWN_VERSION, read_resolved_config, read_run_info

EXIT_OK = 0


def load_resolved(paths: RunPaths, rank: int = 0) -> Project:
    """The run's resolved project, read leniently: keys this clustertrain does not know are dropped; when
    ``run.json`` names another clustertrain version (or keys were dropped), rank 0 says so in one line on stderr."""
    if not paths.config.is_file():
        raise ConfigError(f"{paths.config}: missing; start runs with `clustertrain run PROJECT.yaml`, which writes it")
    info = read_run_info(paths)
    project, notice = read_resolved_config(paths.config, Project, info.clustertrain if info else UNKNOWN_VERSION)
    if notice and rank == 0:
        print(notice, file=sys.stderr, flush=True)
    return project


def run_rank(run_dir: Path, model_name: str) -> int:
    """One rank: its heartbeat (:mod:`clustertrain.train.heartbeat_writer`) from the start, then training; the heartbeat's last
    record says how the rank left (done, its own error, or a failure)."""
    from clustertrain.core.heartbeat_files import EXIT_WATCHDOG
    from clustertrain.core.ranks import RankInfo
    from clustertrain.train.heartbeat_writer import Beacon
    from clustertrain.train.signals import StopRequest
    from clustertrain.train.run_recorder import job_id, node_name

    stop = StopRequest().install()
    paths = RunPaths(Path(run_dir))
    env = RankInfo.from_environ()
    _check_lease(paths, env)  # before this rank writes anything in the run directory
    project = load_resolved(paths, env.rank)
    entry = project.model(model_name)
    beacon = Beacon(paths, env.rank, node_name(), project.monitor.heartbeat_s, job=job_id()).start()
    try:
        code = _train(project, entry, paths, env, stop, beacon)
    except ClusterTrainError:
        beacon.close("error")  # the watchdog: this rank stopped with its own one-line reason (a restart will not help)
        raise
    except BaseException:
        incident = beacon.ended_by_watchdog()
        beacon.close("failed")
        if incident:  # a peer left as the watchdog asked: no traceback for a consequence
            print(f"[clustertrain] rank {env.rank}: stopped with the others (watchdog incident {incident})",
                  file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(EXIT_WATCHDOG)
        lost = _lost_peer(sys.exc_info()[1])
        if lost:  # the peer that left says why; this rank's traceback would only bury that line
            print(f"[clustertrain] rank {env.rank}: stopped: a peer rank left during a collective ({lost})",
                  file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(1)
        raise
    beacon.close("done")
    return code


def _train(project, entry, paths: RunPaths, env, stop, beacon) -> int:
    import torch

    from clustertrain.monitor.sampler import start_sampler, stop_sampler
    from clustertrain.train.checkpoint_backup import CheckpointBackup
    from clustertrain.train.distributed import init_process_group, shutdown_process_group
    from clustertrain.train.hooks import Injections
    from clustertrain.train.trainer import Trainer, write_status
    from clustertrain.train.run_recorder import node_name

    cluster = project.cluster
    if cluster.gpus_per_node > 0:
        if not torch.cuda.is_available():
            raise ConfigError(
                f"cluster.gpus_per_node={cluster.gpus_per_node} but no CUDA device is visible on this node; "
                "set cluster.gpus_per_node: 0 to train on CPU workers"
            )
        device = torch.device("cuda", env.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        beacon.use_device(device)  # the heartbeat says where the GPU is, not only the CPU (hang blame on GPUs)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    from clustertrain.train.threads import setup_rank_cpus  # threads per rank; a GPU rank binds to its GPU's NUMA node

    cpus = setup_rank_cpus(cluster.ranks_per_node, explicit=cluster.threads_per_worker,
                           gpu_index=device.index if device.type == "cuda" else None)
    if env.rank == 0:
        _log(f"rank 0: {cpus.describe()}")
    if env.world_size > 1:
        from clustertrain.monitor.hang_rules import process_group_timeout_s

        # NCCL's own timeout after the watchdog's longest bound and evidence wait; the flight recorder on
        init_process_group(env, backend, process_group_timeout_s(project.monitor), run_dir=paths.root)
    # On an exception the group is left as it is (a barrier would wait for peers that are stuck in
    # a collective); the process exits non-zero and the launcher (or srun --kill-on-bad-exit) stops the rest.
    injections = Injections.from_environ(env.rank)
    sampler = start_sampler(paths, node_name(), project.monitor) if env.local_rank == 0 else None  # one per node
    try:
        backup = CheckpointBackup.for_run(project, entry, log=_log) if env.rank == 0 else None
        trainer = Trainer(project, entry, paths, env, device, injections=injections, backup=backup, beacon=beacon)
        outcome = trainer.fit(stop)
    finally:
        stop_sampler(sampler)
    if env.rank == 0:
        write_status(paths, outcome, backup)
    shutdown_process_group()  # the other ranks exit now; rank 0 waits for its last backup alone
    if backup is not None:
        beacon.phase("upload")  # not a hang however long it takes (clustertrain.monitor.hang_rules.UNBOUNDED)
        if backup.busy():
            _log(f"waiting for the backup of {outcome.checkpoint.name if outcome.checkpoint else 'the last checkpoint'}")
        backup.close()
        trainer.ckpt.prune()  # checkpoints kept while they were being uploaded
        fields = backup.status_fields(outcome.checkpoint)
        outcome.backup = fields["backup"]
        write_status(paths, outcome, backup)
    return EXIT_OK


def _check_lease(paths: RunPaths, env) -> None:
    """Ranks that srun started (a Slurm job's step), train only in a run directory leased to this job or its chain (:mod:`clustertrain.core.run_lease`):
    rank 0 checks (and takes over a lease whose holder has ended); the others wait, reading, until it names the job.
    A refusal is one line; ``srun --kill-on-bad-exit`` then stops the other ranks."""
    job = os.environ.get("SLURM_JOB_ID")
    if env.source != "slurm" or not job:
        return  # the local launcher (or torchrun) that started the ranks holds the lease
    from clustertrain.core.run_lease import LEASE_JOB_ENV, check_for_job, wait_for_job

    chain = os.environ.get(LEASE_JOB_ENV) or None
    if env.rank == 0:
        note = check_for_job(paths, job, chain)
        if note:
            _log(note)
    else:
        wait_for_job(paths, job, chain)


def _lost_peer(error: BaseException | None) -> str:
    """The first line of ``error`` when it says a peer process died (gloo's "Connection closed by peer", …), else
    ''. The launcher (:func:`clustertrain.launch.local._cause`) skips such a rank when it names the failure."""
    from clustertrain.core.ranks import PEER_FAILED_RE

    text = str(error or "").strip().splitlines()
    return text[0][:300] if text and PEER_FAILED_RE.search(text[0]) else ""


def _log(message: str) -> None:
    print(f"[clustertrain] {message}", flush=True)


def main(run_dir: Path, model_name: str) -> int:
    try:
        return run_rank(run_dir, model_name)
    except ClusterTrainError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return e.exit_code
