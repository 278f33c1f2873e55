"""The training loop of one rank, in the shape torchtitan's ``train.py`` has: a short step loop (:class:`Trainer`)
over parts that each own one concern —

- the data path: :class:`clustertrain.train.feed.BatchFeed` (micro-batches by step, prefetched on a GPU);
- one optimizer step: :func:`clustertrain.train.step.train_step` (the layout's forward/backward from
  :mod:`clustertrain.train.parallel`, clipping, the device-side non-finite skip, AdamW) — no host sync in it;
- what the ranks agree on at a step boundary: :class:`clustertrain.train.control.Control` (stop, async commit);
- checkpoints: :class:`clustertrain.train.checkpoint.CheckpointManager` (sync or async);
- what watches the loop: :mod:`clustertrain.train.callbacks` (heartbeat, per-rank timing, the run's records and
  alarms, metrics, backup) — a new concern is a new callback.

A non-finite gradient norm (or logged loss) stops every rank at that step, before the optimizer applies it and
without saving it. Started by :func:`clustertrain.train.entry.main`.
"""

from __future__ import annotations

import math
import os
import sys
import time
from contextlib import contextmanager
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from clustertrain.core.errors import ConfigError, DataError, TrainingError
from clustertrain.core.model_shape import ModelShape
from clustertrain.core.storage_layout import storage_layout
from clustertrain.core.run_events import Event, EventKind, Severity
from clustertrain.project import ModelEntry, Project, architecture_fingerprint
from clustertrain.core.run_paths import RunPaths
from clustertrain.core.run_records import RunStatus, mark_started, write_status_record
from clustertrain.core.states import State
from clustertrain.train import callbacks
from clustertrain.train.checkpoint_backup import CheckpointBackup
from clustertrain.core.checkpoint_format import find_latest, read_meta
from clustertrain.train.checkpoint import CheckpointManager, clean_stale
from clustertrain.core.ranks import RankInfo
from clustertrain.train.heartbeat_writer import Beacon
from clustertrain.train.hooks import FaultInjection, Injections
from clustertrain.core.parallel_layout import LayoutError, ParallelLayout, resolve_layout
from clustertrain.train.metrics import MetricsWriter, peak_flops_for
from clustertrain.train.model import flops_per_token, padded_vocab
from clustertrain.train.control import Control
from clustertrain.train.feed import BatchFeed, open_samples
from clustertrain.train.optim import NonFiniteSkip, build_optimizer, lr_at
from clustertrain.train.parallel import build_parallel_model
from clustertrain.train.parallel.compile import check_compiler
from clustertrain.train.signals import StopRequest
from clustertrain.train.checkpoint_state import TrainState, app_state
from clustertrain.train.step import StepParts, train_step
from clustertrain.train.timing import StepTimer
from clustertrain.train.run_recorder import RunWatch, node_name


@dataclass
class Outcome:
    state: State  # COMPLETED | STOPPED
    step: int
    checkpoint: Path | None
    signal: str | None = None
    backup: str | None = None  # kept for callers; status.json's backup fields come from CheckpointBackup
    stop_saved_s: float | None = None  # STOPPED: seconds from the stop signal to the committed stop checkpoint


class NonFinite(Exception):
    """The step's gradient norm or logged loss is NaN or infinite (every rank sees the same value)."""

    def __init__(self, step: int, what: str, value: float):
        super().__init__(f"non-finite {what} ({value}) at step {step}")
        self.step, self.what, self.value = step, what, value


#: a rank's exit code when it was stopped by a signal and its checkpoint writer was killed first (128 + SIGTERM)
EXIT_KILLED_IN_STOP = 143


def writer_gone(error: BaseException) -> bool:
    """Whether ``error`` says this rank's checkpoint writer process is gone (torch's executor, or ours at start)."""
    text = str(error)
    return isinstance(error, RuntimeError) and ("Checkpoint background process is dead" in text
                                                or "checkpoint writer process exited" in text)


def log(rank: int, msg: str) -> None:
    if rank == 0:
        print(f"[clustertrain] {msg}", flush=True)


def layout_for(project: Project, entry: ModelEntry, world_size: int, on_gpu: bool) -> ParallelLayout:
    """``entry``'s layout on ``world_size`` ranks (a ConfigError line naming the field when impossible)."""
    try:
        return resolve_layout(entry.parallelism, world_size, on_gpu, min(project.cluster.ranks_per_node, world_size))
    except LayoutError as e:
        raise ConfigError(f"models.{entry.name}.{e.field}: {e.message}") from None


#: the heartbeat phase of each timed part
PHASE_OF = {"data": "data", "forward": "forward", "backward": "backward", "optimizer": "optimizer",
            "comm": "collective"}


class Trainer:
    """One rank's run of a model: set up (data, model, optimizer, checkpoints, resume) in ``__init__``, trained by
    :meth:`fit`'s step loop. What watches the loop is a list of callbacks (:mod:`clustertrain.train.callbacks`); what
    the ranks agree on at a step boundary is the control object (:mod:`clustertrain.train.control`); one step is
    :func:`clustertrain.train.step.train_step`; the micro-batches come from :class:`clustertrain.train.feed.BatchFeed`."""

    def __init__(self, project: Project, entry: ModelEntry, paths: RunPaths, env: RankInfo, device: torch.device,
                 resume: bool = True, injections: Injections = Injections(), backup: CheckpointBackup | None = None,
                 beacon: Beacon | None = None, extra: Sequence[callbacks.Callback] = ()):
        """``extra``: callbacks of the caller's, called after the trainer's own (:mod:`clustertrain.train.callbacks`)."""
        self.project, self.entry, self.paths, self.env, self.device = project, entry, paths, env, device
        self.cfg = cfg = entry.training
        self.injections, self.backup = injections, backup
        self.layout = layout_for(project, entry, env.world_size, device.type == "cuda")
        self.dp_rank = self.layout.dp_rank(env.rank)
        self.accum = cfg.global_batch // (cfg.micro_batch * self.layout.dp)
        if self.accum * cfg.micro_batch * self.layout.dp != cfg.global_batch:
            raise DataError(
                f"training.global_batch ({cfg.global_batch}) is not a multiple of micro_batch x dp "
                f"({cfg.micro_batch} x {self.layout.dp}); change global_batch or micro_batch"
            )
        samples, self.tokenizer_vocab = open_samples(paths, entry)
        self.feed = BatchFeed(samples, global_batch=cfg.global_batch, micro_batch=cfg.micro_batch,
                              dp_rank=self.dp_rank, accum=self.accum, device=device,
                              slow_data_s=injections.slow_data_s)
        vocab = padded_vocab(entry.model, self.tokenizer_vocab)
        if self.layout.compile:
            check_compiler(device, f"models.{entry.name}.parallelism.compile")
        self.pm = build_parallel_model(entry.model, vocab, self.layout, device, seed=cfg.seed, microbatches=self.accum)
        self.model = self.pm.model
        self.flops_per_token = flops_per_token(entry.model, self.pm.non_embedding_params)
        self.arch_line = ModelShape.from_arch(entry.model, vocab).describe()
        self.optimizer = build_optimizer(self.model, cfg)
        norm_part = "comm" if self.layout.fsdp or self.layout.tp > 1 or self.layout.pp > 1 else "optimizer"
        self.parts = StepParts(self.pm, self.optimizer, NonFiniteSkip(device), cfg, norm_part=norm_part)
        # dropout streams per data-parallel rank: the ranks of a tensor-parallel group draw the same masks
        torch.manual_seed(cfg.seed + 1 + self.dp_rank)
        self.train_state = TrainState()
        self.control = Control()
        self._save_started: dict[int, float] = {}  # step -> when its save began (rank 0: the save's duration)
        # async saves are written by a process of each rank's own, their staging copy overlapped with the next
        # step's forward and backward (done before its optimizer step): clustertrain.train.checkpoint_async
        self.ckpt = CheckpointManager(
            paths.checkpoints, cfg.keep_last, architecture_fingerprint(project, entry), project.name, entry.name,
            env.rank, env.world_size, layout=self.layout.to_dict(), process_group=self.control.group,
            protected=backup.protected if backup is not None else None, overlap_staging=cfg.async_checkpoint,
        )
        # the writer process (its own torch import, ~2 s of CPU) starts after the first step, not beside the ranks'
        # start-up on the same cores, and still in the background before the first save's stall (:meth:`_fit`)
        self._writer_pending = cfg.async_checkpoint
        self.parts.before_optimizer = self.ckpt.staged
        if env.rank == 0:
            mark_started(paths)  # not completed until this run of the ranks says so (clustertrain.core.run_records)
            clean_stale(paths.checkpoints)
        if resume:
            self._resume()
        if cfg.init_from and self.step == 0:  # no checkpoint of the run's own: continue the Hugging Face model
            from clustertrain.train.init_from import load_init_from

            log(env.rank, load_init_from(self.model, project, entry, self.pm.total_params))
        peak = peak_flops_for(torch.cuda.get_device_name(device) if device.type == "cuda" else None)
        self.peak_total = peak * env.world_size if peak else None
        self.nodes = [str(n) for n in self.control.gather_objects(node_name())]  # every rank's node, by rank
        monitor = project.monitor
        self.timer = StepTimer(env.rank, self.nodes[env.rank], paths.rank_timing(env.rank) if monitor.enabled else None,
                               device)
        self.watch = (callbacks.Watch(RunWatch(paths, monitor, self.nodes, env.world_size, env.world_size, self.step),
                                      monitor.enabled) if env.rank == 0 else None)
        tensorboard = ((storage_layout(project).tensorboard_dir(entry.name) or paths.tensorboard)
                       if monitor.trackers.tensorboard else None)
        metrics = MetricsWriter(paths.metrics, tensorboard, self.step) if env.rank == 0 else None
        trackers = (callbacks.Trackers.open(project, entry, paths, self.step, self.layout, self.watch)
                    if env.rank == 0 else None)
        self.callbacks = callbacks.Callbacks(
            callbacks.Heartbeat(beacon) if beacon is not None else None,
            callbacks.Timing(self.timer),
            self.watch,  # before Metrics: it adds the slowest rank and the spread to the row
            callbacks.Metrics(metrics) if metrics is not None else None,
            trackers,  # after Metrics: the row as metrics.jsonl has it
            callbacks.Backup(backup, entry, cfg.max_steps) if backup is not None else None,
            FaultInjection(injections, paths.root, env.rank, self.control, lambda name: self.callbacks.phase(name))
            if injections.at_step_start() else None,
            *extra,
        )

    @property
    def step(self) -> int:
        return self.train_state.step

    def _resume(self) -> None:
        """Continue from the latest complete checkpoint, if there is one, in whatever layout it was written
        (DCP reshards): parameters, optimizer moments, step and data position exactly; the per-rank RNG
        streams only when the layout is unchanged (otherwise they restart from the seed and the step)."""
        # rank 0 checks ownership and damage, once, and tells the others (a restart's stats are O(files), not O(ranks x files))
        loaded = self.ckpt.load_latest(app_state(self.model, self.optimizer, self.train_state))
        if loaded is None:
            return
        for note in loaded.notes:  # a damaged newer checkpoint was skipped: say so
            log(self.env.rank, note)
        if not self.ckpt.same_layout(loaded.meta):
            torch.manual_seed(self.cfg.seed + 1 + self.dp_rank + 1_000_003 * self.step)
            log(self.env.rank, f"checkpoint layout differs from {self.layout.describe()}: resharded; RNG streams restart")
        log(self.env.rank, f"resumed from {loaded.path} (step {self.step})")

    # -- the step -------------------------------------------------------------------------------------
    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        """A part of the step (:data:`clustertrain.train.timing.PARTS`): the heartbeat's phase, and its time."""
        self.callbacks.phase(PHASE_OF[name])
        with self.timer.part(name):
            yield

    def _train_step(self) -> tuple[torch.Tensor, torch.Tensor]:
        scale = float("nan") if self.injections.nan_at_step == self.step + 1 else 1.0 / self.accum
        # a pipeline schedule takes the step's micro-batches at once; otherwise each is read at its turn
        batches = self.feed.step_batches(self.step, self.part, lazy=self.layout.pp == 1)
        return train_step(self.parts, self.step, batches, scale, self.part)

    def check_finite(self) -> None:
        """Raise NonFinite for the first step whose gradient norm was not finite (skipped on the device); a host
        sync, called where the loop syncs anyway: before a log row and before a checkpoint."""
        bad = self.parts.nonfinite.first()
        if bad is not None:
            raise NonFinite(bad[0], "gradient norm", bad[1])

    # -- the loop -------------------------------------------------------------------------------------
    def fit(self, stop: StopRequest) -> Outcome:
        cfg, rank = self.cfg, self.env.rank
        log(rank, f"model {self.entry.name}: {self.pm.total_params:,} parameters ({self.arch_line}), {self.env.world_size} rank(s) "
                  f"({self.layout.describe(dtypes=False)}, {self.pm.precision.describe()}), grad accumulation "
                  f"{self.accum}, device {self.device.type}, steps {self.step}->{cfg.max_steps}")
        self.saved: Path | None = None
        self._stopping = False
        self._stop_received: float | None = None
        self.pm.train()
        try:
            return self._fit(stop)
        except NonFinite as e:
            raise TrainingError(self._diverged(e)) from None
        except BaseException as e:
            self._close_after_failure()
            if stop.requested and writer_gone(e):
                # scancel: Slurm TERMs every process of the step, then KILLs them one by one after KillWait; when
                # the writer goes first the stop save cannot finish. Not a failure of the run: the job says CANCELLED
                print(f"[clustertrain] rank {rank}: stopped by {stop.signal_name or 'a signal'} before the stop "
                      f"checkpoint was written (its writer process was killed); the last committed checkpoint stands",
                      file=sys.stderr, flush=True)
                raise SystemExit(EXIT_KILLED_IN_STOP) from None
            detail = str(e).splitlines()[0] if str(e) else ""
            self.callbacks.failed(self.step, f"rank 0 failed at step {self.step + 1}: {type(e).__name__}"
                                             + (f": {detail}" if detail else ""))
            raise
        finally:
            self.callbacks.close()

    def _close_after_failure(self) -> None:
        """Stop the checkpoint writer process (and pending deletes) of a failed run, committing an async save every
        rank finished writing (DCP's write ends in a collective: its future resolves once all ranks' data is down);
        never masks the failure."""
        try:
            self._committed(self.ckpt.close())
        except BaseException as e:  # the failure being raised is the one to report
            print(f"[clustertrain] rank {self.env.rank}: closing the checkpoints after the failure: {e}",
                  file=sys.stderr, flush=True)

    def _fit(self, stop: StopRequest) -> Outcome:
        cfg = self.cfg
        interval_time, interval_steps = 0.0, 0
        while self.step < cfg.max_steps:
            t0 = time.perf_counter()
            self.callbacks.phase("data", step=self.step + 1)  # the heartbeat names the new step from here on
            self.callbacks.step_started(self.step + 1)
            lr = lr_at(self.step, cfg)
            loss, grad_norm = self._train_step()
            self.train_state.step += 1
            if self.device.type == "cuda" and self.step % cfg.log_every == 0:
                torch.cuda.synchronize(self.device)  # the interval's time is the device's
            seconds = time.perf_counter() - t0
            interval_time += seconds
            interval_steps += 1
            self.callbacks.step_done(self.step, seconds, interval_time / interval_steps)
            if self.step % cfg.log_every == 0 or self.step in (1, cfg.max_steps):
                self._log_row(loss, grad_norm, lr, interval_time / interval_steps)
                interval_time, interval_steps = 0.0, 0
            if self._writer_pending:  # every rank at the same step (one broadcast); a save at step 1 starts it itself
                self._writer_pending = False
                if self.step % cfg.checkpoint_every and self.step < cfg.max_steps:
                    self.ckpt.prepare_async()
            self._stopping = self._agree_stop(stop)  # also commits an async save every rank has written
            if self._stopping and self._stop_received is None:
                self._stop_received = stop.received or time.time()  # a peer's signal: now is when rank 0 knew
                self.callbacks.stop_signal(self.step, stop.signal_name, self._stop_received)
            final = self._stopping or self.step == cfg.max_steps
            if final or self.step % cfg.checkpoint_every == 0:
                self._save(final)
            if self._stopping and self.step < cfg.max_steps:  # at max_steps the run has completed, signal or not
                self.control.finish()
                log(self.env.rank, f"stopped by {stop.signal_name or 'a peer rank'} after step {self.step}; "
                                   f"checkpoint saved to {self.saved}; re-run the same command to resume")
                self._committed(self.ckpt.close())  # committed already by the final save: stops the writer
                self.callbacks.finished(State.STOPPED, self.step)
                return Outcome(State.STOPPED, self.step, self.saved, stop.signal_name,
                               stop_saved_s=self.watch.stop_saved_s if self.watch else None)
        self.control.finish()  # every rank has one check in flight: settle it before the group goes away
        self._committed(self.ckpt.close())  # and the writer process stops
        saved = self.saved
        if saved is None:
            saved = find_latest(self.paths.checkpoints)
            if saved is not None and self.backup is not None:  # resumed at max_steps: make sure the last one is copied
                self.backup.submit(saved)
        log(self.env.rank, f"training complete at step {self.step}; final checkpoint {saved}")
        self.callbacks.finished(State.COMPLETED, self.step)
        return Outcome(State.COMPLETED, self.step, saved)

    def _agree_stop(self, stop: StopRequest) -> bool:
        """True when some rank had a stop request by the previous step boundary (the same answer on every rank).
        The same collective carries each rank's finished async save: one that every rank had finished by the
        previous boundary is committed here, at the same step on every rank (a rank that saw its own write fail
        earlier than a peer would otherwise stop while that peer trains on into a dead collective)."""
        if not self.control.distributed:
            self._committed(self.ckpt.poll())
            return stop.requested
        with self.part("comm"):
            agreed, finished = self.control.finish()
        self._committed(self.ckpt.commit_finished(finished))
        self.control.start(stop.requested, self.ckpt.finished_step())
        return agreed

    def _log_row(self, loss: torch.Tensor, grad_norm: torch.Tensor, lr: float, step_time: float) -> None:
        self.check_finite()
        with self.part("comm"):  # counted in the next interval: this one's means travel in the gather
            losses, timings = self.timer.gather(float(loss), self.control.group, self.env.world_size)
        mean_loss = sum(losses) / len(losses)  # every rank of a tensor-parallel group holds its dp rank's loss
        if not math.isfinite(mean_loss):  # the same gathered value on every rank: they all stop here
            raise NonFinite(self.step, "loss", mean_loss)
        tps = self.cfg.global_batch * self.entry.model.seq_len / step_time
        row = {
            "step": self.step, "loss": round(mean_loss, 6), "lr": lr, "grad_norm": round(float(grad_norm), 6),
            "tokens_per_s": round(tps, 1), "step_time_s": round(step_time, 5),
            "mfu": round(self.flops_per_token * tps / self.peak_total, 4) if self.peak_total else None,
            "tokens": self.step * self.cfg.global_batch * self.entry.model.seq_len, "time": time.time(),
        }
        if self.device.type == "cuda":  # for checking the planner's per-rank memory against real runs
            row["mem_allocated_gib"] = round(torch.cuda.max_memory_allocated(self.device) / 2**30, 3)
            row["mem_reserved_gib"] = round(torch.cuda.max_memory_reserved(self.device) / 2**30, 3)
        self.callbacks.logged(row, timings)
        log(self.env.rank, f"step {self.step}/{self.cfg.max_steps} loss {row['loss']:.4f} lr {lr:.2e} "
                           f"grad_norm {row['grad_norm']:.3f} {tps:,.0f} tok/s")

    # -- checkpoints ----------------------------------------------------------------------------------
    def _save(self, final: bool) -> None:
        """Save at this step: asynchronously unless it is the run's last save (then wait, so it is committed)."""
        self.check_finite()  # never save a state after a skipped step: the run stops at the step it names
        self.callbacks.phase("checkpoint")
        started = time.perf_counter()
        if self.env.rank == 0:  # only rank 0 commits, and so learns how long a save took
            self._save_started[self.step] = time.time()
        self.train_state.consumed_samples = self.step * self.cfg.global_batch
        if final:  # an async save still in flight is committed here, not inside the synchronous save that drops it
            self._committed(self.ckpt.wait())
        state = app_state(self.model, self.optimizer, self.train_state)
        self._committed(self.ckpt.save(self.step, self.train_state.consumed_samples, state,
                                       async_save=self.cfg.async_checkpoint and not final))
        if final:
            self._committed(self.ckpt.wait())
        self.callbacks.save_stalled(time.perf_counter() - started)

    def _committed(self, path: Path | None) -> None:
        """A checkpoint that is now complete (rank 0): log it and tell the callbacks (heartbeat, watch, backup)."""
        if path is None:
            return
        self.saved = path
        log(self.env.rank, f"saved checkpoint {path}")
        step = read_meta(path).step
        started = self._save_started.pop(step, None)
        self.callbacks.committed(step, path, time.time() - started if started is not None else None,
                                 self._stopping, self._stop_received)

    # -- failures -------------------------------------------------------------------------------------
    def _diverged(self, e: NonFinite) -> str:
        """Stop on a non-finite step: nothing of it is saved; an async save of an earlier step still in flight is
        finished (it holds a good state) and the writer process stopped. The one line names the step and the last good
        checkpoint."""
        self._committed(self.ckpt.close())
        last = find_latest(self.paths.checkpoints)
        where = (f"the last good checkpoint is {last} (step {read_meta(last).step}); resume from it (run the same "
                 "command) with a lower training.lr or a training.grad_clip, or look at the data of that step"
                 if last else "no checkpoint was written before it; lower training.lr or set training.grad_clip")
        message = f"models.{self.entry.name}: {e}; stopped without saving it; {where}"
        self.callbacks.event(Event(kind=EventKind.NONFINITE, severity=Severity.ERROR, step=e.step, value=e.value,
                                   message=message))
        self.callbacks.failed(e.step, message)
        return message


def write_status(paths: RunPaths, outcome: Outcome, backup: CheckpointBackup | None = None) -> None:
    """``status.json``, then (when training reached its last step) the ``COMPLETED`` marker: formats in
    :mod:`clustertrain.core.run_records`; backup fields in :mod:`clustertrain.train.checkpoint_backup`."""
    fields = {"backup": outcome.backup, **(backup.status_fields(outcome.checkpoint) if backup is not None else {})}
    status = RunStatus(state=outcome.state, step=outcome.step, signal=outcome.signal,
                       checkpoint=str(outcome.checkpoint) if outcome.checkpoint else None,
                       pid=os.getpid(), time=time.time(), stop_saved_s=outcome.stop_saved_s, **fields)
    write_status_record(paths, status)
