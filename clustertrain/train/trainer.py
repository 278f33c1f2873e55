"""The training loop of one rank: DDP over torch.distributed, grad accumulation, clipping,
schedules, checkpoints, metrics and graceful stop. Started by :func:`clustertrain.train.entry.main`."""

from __future__ import annotations

import os
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from clustertrain.data import GPTSamples, load_tokenizer, read_manifest
from clustertrain.data.vocab import check_vocab
from clustertrain.errors import ConfigError, DataError, RunDirError
from clustertrain.project import ModelEntry, Project, architecture_fingerprint
from clustertrain.layout import storage_layout
from clustertrain.rundir import RunPaths
from clustertrain.runstate import RunStatus, mark_started, read_run_info, write_status_record
from clustertrain.states import State
from clustertrain.train.backup import CheckpointBackup, is_due
from clustertrain.train.checkpoint import CheckpointManager, check_ownership, clean_stale, find_latest
from clustertrain.train.distributed import RankEnv
from clustertrain.train.metrics import MetricsWriter, peak_flops_for
from clustertrain.train.model import GPT, flops_per_token, padded_vocab
from clustertrain.train.optim import build_optimizer, build_scheduler
from clustertrain.train.signals import StopRequest


@dataclass
class Outcome:
    state: State  # COMPLETED | STOPPED
    step: int
    checkpoint: Path | None
    signal: str | None = None
    backup: str | None = None  # kept for callers; status.json's backup fields come from CheckpointBackup


def log(rank: int, msg: str) -> None:
    if rank == 0:
        print(f"[clustertrain] {msg}", flush=True)


class Trainer:
    def __init__(self, project: Project, entry: ModelEntry, paths: RunPaths, env: RankEnv, device: torch.device,
                 resume: bool = True, fail_at_step: int | None = None, backup: CheckpointBackup | None = None):
        self.fail_at_step = fail_at_step
        self.backup = backup
        self.project, self.entry, self.paths, self.env, self.device = project, entry, paths, env, device
        cfg = entry.training
        self.cfg = cfg
        self.dp = env.world_size
        self.accum = cfg.global_batch // (cfg.micro_batch * self.dp)
        if self.accum * cfg.micro_batch * self.dp != cfg.global_batch:
            raise DataError(
                f"training.global_batch ({cfg.global_batch}) is not a multiple of micro_batch x world size "
                f"({cfg.micro_batch} x {self.dp}); change global_batch or micro_batch"
            )
        run = read_run_info(paths)
        if run is None:
            raise RunDirError(f"{paths.run_json}: missing; start runs with `clustertrain run`/`submit`, which write it")
        if not Path(run.dataset + ".idx").is_file():
            raise DataError(f"{run.dataset}: prepared dataset is missing; re-run `clustertrain run` to prepare it")
        self.tokenizer_vocab = dataset_vocab(run.dataset, entry)
        problem = check_vocab(entry, self.tokenizer_vocab)
        if problem:
            raise ConfigError(problem)
        self.samples = GPTSamples(run.dataset, entry.model.seq_len, cfg.seed, split=entry.data.split)

        torch.manual_seed(cfg.seed)
        model = GPT(entry.model, padded_vocab(entry.model, self.tokenizer_vocab)).to(device)
        self.flops_per_token = flops_per_token(entry.model, model.num_params(non_embedding=True))
        self.raw_model = model
        ddp_kwargs = {"device_ids": [device.index]} if device.type == "cuda" else {}
        self.model = DDP(model, **ddp_kwargs) if dist.is_initialized() else model
        self.optimizer = build_optimizer(model, cfg)
        self.scheduler = build_scheduler(self.optimizer, cfg)
        torch.manual_seed(cfg.seed + 1 + env.rank)  # per-rank dropout stream
        use_bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and device.type == "cuda")
        self.autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if use_bf16 else nullcontext
        # The stop flag travels on its own CPU (gloo) group, asynchronously: each step boundary starts an
        # all-reduce of this rank's flag and reads the one started a step earlier (long finished by then).
        # Ranks therefore agree without a per-step synchronisation point, at the cost of one step of delay.
        self.ctrl = dist.new_group(backend="gloo") if dist.is_initialized() else None
        self._stop_flag: torch.Tensor | None = None
        self._stop_work = None
        self.ckpt = CheckpointManager(
            paths.checkpoints, cfg.keep_last, architecture_fingerprint(project, entry), project.name, entry.name,
            env.rank, env.world_size, protected=backup.protected if backup is not None else None,
        )
        self.step = 0
        if env.rank == 0:
            mark_started(paths)  # not completed until this run of the ranks says so (clustertrain.runstate)
            clean_stale(paths.checkpoints)
        if resume:
            self._resume()
        self.metrics = (
            MetricsWriter(paths.metrics, storage_layout(project).tensorboard_dir(entry.name) or paths.tensorboard, self.step) if env.rank == 0 else None
        )
        peak = peak_flops_for(torch.cuda.get_device_name(device) if device.type == "cuda" else None)
        self.peak_total = peak * env.world_size if peak else None

    def _resume(self) -> None:
        """Continue from the latest complete checkpoint, if there is one (model, optimizer, scheduler, RNG, step)."""
        check_ownership(self.paths.checkpoints, self.ckpt.fingerprint, self.project.name, self.entry.name)
        latest = find_latest(self.paths.checkpoints)
        if latest is None:
            return
        meta, extra = self.ckpt.load(latest, self.raw_model, self.optimizer)
        self.step = meta.step
        if extra is not None:
            torch.set_rng_state(extra["rng_cpu"])
            if self.device.type == "cuda" and extra.get("rng_cuda") is not None:
                torch.cuda.set_rng_state(extra["rng_cuda"], self.device)
            self.scheduler.load_state_dict(extra["scheduler"])
        else:
            self.scheduler.last_epoch = self.step
            self.scheduler._last_lr = [g["lr"] for g in self.optimizer.param_groups]
            log(self.env.rank, f"world size changed since the checkpoint ({meta.world_size} -> "
                               f"{self.env.world_size}): RNG streams restart")
        log(self.env.rank, f"resumed from {latest} (step {self.step})")

    # ------------------------------------------------------------------
    def _batch(self, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        start = self.step * cfg.global_batch + (self.env.rank * self.accum + micro) * cfg.micro_batch
        data = torch.from_numpy(self.samples.batch(start, cfg.micro_batch))
        if self.device.type == "cuda":
            data = data.pin_memory().to(self.device, non_blocking=True)
        return data[:, :-1], data[:, 1:]

    def _train_step(self) -> tuple[torch.Tensor, torch.Tensor]:
        loss_sum = torch.zeros((), device=self.device)
        for micro in range(self.accum):
            x, y = self._batch(micro)
            sync = micro == self.accum - 1 or not isinstance(self.model, DDP)
            with nullcontext() if sync else self.model.no_sync():  # all-reduce gradients on the last micro-step only
                with self.autocast():
                    loss = self.model(x, y) / self.accum
                loss.backward()
            loss_sum += loss.detach()
        max_norm = self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), max_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss_sum, grad_norm

    def _agree_stop(self, stop: StopRequest) -> bool:
        """True when some rank had a stop request by the previous step boundary (the same answer on every rank)."""
        if not dist.is_initialized():
            return stop.requested
        agreed = self._finish_stop_check()
        self._stop_flag = torch.tensor([1 if stop.requested else 0], dtype=torch.int32)
        self._stop_work = dist.all_reduce(self._stop_flag, op=dist.ReduceOp.MAX, group=self.ctrl, async_op=True)
        return agreed

    def _finish_stop_check(self) -> bool:
        if self._stop_work is None:
            return False
        self._stop_work.wait()
        self._stop_work = None
        return bool(self._stop_flag.item())

    def _save(self) -> Path:
        extra = {
            "rng_cpu": torch.get_rng_state(),
            "rng_cuda": torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None,
            "scheduler": self.scheduler.state_dict(),
        }
        return self.ckpt.save(self.step, self.step * self.cfg.global_batch, self.raw_model, self.optimizer, extra)

    def fit(self, stop: StopRequest) -> Outcome:
        cfg, rank = self.cfg, self.env.rank
        tokens_per_step = cfg.global_batch * self.entry.model.seq_len
        log(rank, f"model {self.entry.name}: {self.raw_model.num_params():,} parameters, {self.env.world_size} rank(s), "
                  f"grad accumulation {self.accum}, device {self.device.type}, steps {self.step}->{cfg.max_steps}")
        saved: Path | None = None
        interval_time, interval_steps = 0.0, 0
        self.model.train()
        try:
            while self.step < cfg.max_steps:
                t0 = time.perf_counter()
                if self.fail_at_step is not None and self.step + 1 >= self.fail_at_step:
                    raise RuntimeError(f"injected failure at step {self.step + 1} (CLUSTERTRAIN_INJECT_FAILURE)")
                lr = self.scheduler.get_last_lr()[0]
                loss, grad_norm = self._train_step()
                self.step += 1
                if self.device.type == "cuda" and (self.step % cfg.log_every == 0):
                    torch.cuda.synchronize(self.device)
                interval_time += time.perf_counter() - t0
                interval_steps += 1
                if self.step % cfg.log_every == 0 or self.step in (1, cfg.max_steps):
                    if dist.is_initialized():
                        dist.all_reduce(loss, op=dist.ReduceOp.SUM)
                        loss /= self.env.world_size
                    step_time = interval_time / interval_steps
                    tps = tokens_per_step / step_time
                    row = {
                        "step": self.step, "loss": round(float(loss), 6), "lr": lr, "grad_norm": round(float(grad_norm), 6),
                        "tokens_per_s": round(tps, 1), "step_time_s": round(step_time, 5),
                        "mfu": round(self.flops_per_token * tps / self.peak_total, 4) if self.peak_total else None,
                        "tokens": self.step * tokens_per_step, "time": time.time(),
                    }
                    if self.metrics:
                        self.metrics.write(row)
                    log(rank, f"step {self.step}/{cfg.max_steps} loss {row['loss']:.4f} lr {lr:.2e} "
                              f"grad_norm {row['grad_norm']:.3f} {tps:,.0f} tok/s")
                    interval_time, interval_steps = 0.0, 0
                stopping = self._agree_stop(stop)
                if stopping or self.step % cfg.checkpoint_every == 0 or self.step == cfg.max_steps:
                    saved = self._save()
                    log(rank, f"saved checkpoint {saved}")
                    if self.backup is not None and (stopping or self.step == cfg.max_steps or is_due(self.entry, self.step)):
                        self.backup.submit(saved)
                if stopping and self.step < cfg.max_steps:  # at max_steps the run has completed, signal or not
                    self._finish_stop_check()
                    log(rank, f"stopped by {stop.signal_name or 'a peer rank'} after step {self.step}; "
                              f"checkpoint saved to {saved}; re-run the same command to resume")
                    return Outcome(State.STOPPED, self.step, saved, stop.signal_name)
        finally:
            if self.metrics:
                self.metrics.close()
        self._finish_stop_check()  # every rank has one check in flight: settle it before the group goes away
        if saved is None:
            saved = find_latest(self.paths.checkpoints)
            if saved is not None and self.backup is not None:  # resumed at max_steps: make sure the last one is copied
                self.backup.submit(saved)
        log(rank, f"training complete at step {self.step}; final checkpoint {saved}")
        return Outcome(State.COMPLETED, self.step, saved)


def dataset_vocab(dataset: str, entry: ModelEntry) -> int:
    """The tokenizer's vocabulary size as recorded in the prepared dataset's manifest (staging checked that
    the manifest names ``data.tokenizer``), so ranks need not read the tokenizer file; loading the tokenizer
    only for datasets without a manifest (e.g. made by Megatron's preprocess_data.py)."""
    manifest = read_manifest(dataset)
    if manifest is not None and isinstance(manifest.get("vocab_size"), int):
        return manifest["vocab_size"]
    return load_tokenizer(entry.data.tokenizer).vocab_size


def write_status(paths: RunPaths, outcome: Outcome, backup: CheckpointBackup | None = None) -> None:
    """``status.json``, then (when training reached its last step) the ``COMPLETED`` marker: formats in
    :mod:`clustertrain.runstate`; backup fields in :mod:`clustertrain.train.backup`."""
    fields = {"backup": outcome.backup, **(backup.status_fields(outcome.checkpoint) if backup is not None else {})}
    status = RunStatus(state=outcome.state, step=outcome.step, signal=outcome.signal,
                       checkpoint=str(outcome.checkpoint) if outcome.checkpoint else None,
                       pid=os.getpid(), time=time.time(), **fields)
    write_status_record(paths, status)
