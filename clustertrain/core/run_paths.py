"""The run directory: every path a run reads or writes, named in one place. Where the run directory
itself lives (and the Slurm output and TensorBoard directories when the project puts them elsewhere)
is :mod:`clustertrain.core.storage_layout`'s rule.

    RUN_DIR/
      run.json              identity: project, model, architecture fingerprint, dataset, created, the clustertrain
                            version that prepared the run (written by the launcher; clustertrain.core.run_records.RunInfo)
      config.yaml           the resolved project file the ranks read (defaults filled in, overrides applied; ranks of
                            another clustertrain version read it leniently: clustertrain.core.run_records.read_resolved_config)
      metrics.jsonl         one JSON object per logged step (see clustertrain.train.metrics)
      tensorboard/          TensorBoard event files (rank 0), unless storage.tensorboard / aws.fsx[].holds puts them elsewhere
      logs/rank<R>.log      stdout+stderr of each local rank (local backend)
      checkpoints/          step_<8 digits>/ (DCP shards + meta.json) and the `latest` pointer
                            (clustertrain.train.checkpoint)
      status.json           how the last run of the ranks ended: COMPLETED | STOPPED, step, checkpoint, and the
                            checkpoint backups (clustertrain.core.run_records.RunStatus; the backup fields:
                            clustertrain.train.checkpoint_backup)
      jobs.jsonl            one record per submitted Slurm job (Slurm backend; see clustertrain.core.job_records)
      COMPLETED             empty marker: training reached its last step (written after status.json, removed when the
                            ranks start; clustertrain.core.run_records)
      events.jsonl          rank 0's alarms (non-finite loss, loss spike, throughput drop, straggler), one JSON per line
      timing/rank<R>.jsonl  each rank's data / compute / comm time per logged step
      usage.json            one record per start of the ranks: when, where, how many GPUs (GPU-hours and cost)
      monitor/<node>.csv    the node sampler's GPU and host samples (clustertrain.monitor.samples); beside it
                            <node>.events.jsonl, the sampler's GPU events (formats: clustertrain.core.run_events)
      heartbeat/rank<R>.json each rank's heartbeat: step, phase, liveness (clustertrain.core.heartbeat_files); beside
                            them request.json, the watchdog's request to dump stacks (and to exit)
      incidents/<time>/     what the watchdog collected about one hang or lost rank: incident.json, every rank's
                            stack, flight-recorder dumps (clustertrain.monitor.hang_watchdog)
      jobs/                 the batch script of each submission, kept as submitted, and <job id>.end: the state the
                            batch script recorded when the job ended (clustertrain.core.job_records)
      lease.json            who may write the run directory now: a live `run`/`submit` process, or the Slurm job (chain)
                            that carries the run; .lease.lock beside it, the file a live process holder keeps flock'ed
                            (clustertrain.core.run_lease)

Formats of the files clustertrain writes here and reads back (typed, lenient models with a ``version`` and the
writer's ``clustertrain`` version): :mod:`clustertrain.core.run_records`.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunPaths:
    root: Path

    @property
    def run_json(self) -> Path:
        return self.root / "run.json"

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def rank_log(self, rank: int) -> Path:
        return self.logs / f"rank{rank}.log"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def status(self) -> Path:
        return self.root / "status.json"

    @property
    def jobs(self) -> Path:
        return self.root / "jobs.jsonl"

    @property
    def events(self) -> Path:
        return self.root / "events.jsonl"

    @property
    def timing(self) -> Path:
        return self.root / "timing"

    def rank_timing(self, rank: int) -> Path:
        return self.timing / f"rank{rank}.jsonl"

    @property
    def usage(self) -> Path:
        return self.root / "usage.json"

    @property
    def monitor(self) -> Path:
        return self.root / "monitor"

    def node_samples(self, node: str) -> Path:
        return self.monitor / f"{safe_node(node)}.csv"

    def node_events(self, node: str) -> Path:
        return self.monitor / f"{safe_node(node)}.events.jsonl"

    @property
    def heartbeat(self) -> Path:
        return self.root / "heartbeat"

    def rank_heartbeat(self, rank: int) -> Path:
        return self.heartbeat / f"rank{rank}.json"

    @property
    def incidents(self) -> Path:
        return self.root / "incidents"

    @property
    def completed(self) -> Path:
        """Empty marker file: present exactly when training reached its last step (the batch script
        tests ``[ -e "$RUN_DIR/COMPLETED" ]`` to decide whether to requeue)."""
        return self.root / "COMPLETED"


def safe_node(node: str) -> str:
    """A node name as a file name (host names already are; anything else becomes ``_``)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", node) or "node"


def write_atomic(path: Path, data: str | bytes, mode: int | None = None) -> None:
    """Write ``data`` (text as UTF-8, or bytes) to a temp file beside ``path``, fsync, rename it into
    place and fsync the directory: readers see the old file or the whole new one, never a part.
    ``mode`` sets the permission bits (default: 0o666 less the umask, like ``open``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        if mode is None:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
