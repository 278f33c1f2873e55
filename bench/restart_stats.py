"""A resume's file-system metadata operations per rank — opens, directory listings, stats — for the current rule
(rank 0 decides which checkpoint resumes and broadcasts it; an FSDP layout's replicated entries saved in the lowest
rank's file) against the old rule (every rank checks), counted side by side in one run at several world sizes, then
extrapolated to the flagship.

    flock /tmp/ct-heavy.lock .venv/bin/python bench/restart_stats.py [--worlds 2 4 8] [--keep 3]
    .venv/bin/python bench/restart_stats.py --smoke     # 2 ranks, 2 kept checkpoints, no extrapolation

Reference: the old rule (every rank checks), counted in the same ranks, in the same run, right before the new rules.
The counts are exact and deterministic (no timing), so there is one round (``--rounds`` is ignored) and no
interleaving to do: in each rank process the three rules resume one after another (old, decide, current), each from
a fresh :class:`CheckpointManager`. Figures (bench/harness.py ``Ratio``): all ranks' operations per resume, current ÷
old and decide ÷ old, at each world size and extrapolated to 640 ranks ("measured": no target); and the target of
issue 38 item 5 (a restart's metadata work is O(files) once, on rank 0): each other rank's operations under the
current rule at the largest world ÷ at the smallest, target <= 1 (constant per rank, whatever the world size).

For each world size W, W gloo ranks (CPU, one thread each) build a small FSDP2 model + AdamW, save ``--keep``
checkpoints through :class:`clustertrain.train.checkpoint.CheckpointManager` exactly as the trainer does (DCP, one
``__<R>_0.distcp`` per rank + ``.metadata`` + ``meta.json``: W + 2 files each; ``keep_last`` = ``--keep``), then
resume from them once per rule, counting each rank's operations under the checkpoint directories:

* **decide** (issue 38's first step, commit 17af169): :meth:`CheckpointManager.load_latest` on checkpoints saved as
  before — rank 0 runs ``check_ownership`` and ``inspect`` on every
  candidate and broadcasts; every rank then runs DCP's load;
* **old** (the reference): the rule before issue 38, reproduced here from the format functions of
  :mod:`clustertrain.core.checkpoint_format` on **every** rank, as the trainer and ``load_latest`` of commit
  17af169's parent did: ``check_ownership``, then ``resume_candidates`` with ``damage`` on each until one passes,
  then :meth:`CheckpointManager.load` (which reads ``meta.json`` and runs DCP's load);
* **current** (what the trainer does): decide, from checkpoints saved beside them as the trainer saves an FSDP layout
  now, ``DefaultSavePlanner(dedup_save_to_lowest_rank=True)``
  (:func:`clustertrain.train.checkpoint_async.save_planner`). Each parameter has replicated entries (AdamW's ``step``,
  format 3's hyper-parameters: 12 per tensor) that DCP's default planner spreads over every rank's file (the plan
  with the least bytes keeps each, ``_dedup_save_plans.py``), so every rank's load opens every data file — in the
  old and the decide rule alike; kept in rank 0's file (current), a rank opens ``.metadata``, its own file and rank 0's.

Counted (:class:`FileOps`, in-process, only paths under the checkpoint directory): ``open`` (builtin and ``os.open``)
and ``os.listdir``/``os.scandir`` through CPython's audit events; ``stat``: ``os.stat``/``os.lstat`` (what
``Path.stat``/``exists``/``is_file``/``is_dir`` call) through pass-through wrappers, and the first ``stat()`` of each
``os.DirEntry`` that ``os.scandir`` yields (the damage scan's per-file sizes; no audit event covers either). Not
counted: ``DirEntry.is_file()``/``is_dir()``, free where the file system fills ``d_type``. The counts are exact and
deterministic (no timing), so one resume per rule suffices.

Extrapolation: per-rank counts are fitted as ``a + b x F`` (F = files of one checkpoint = W + 2, ``--keep`` fixed),
rank 0 and the other ranks' mean separately (the fit's largest residual is printed; 0 means exact), then evaluated
at the flagship (examples/p5e-80x7.yaml: models 1-6 each on 11 nodes x 8 GPUs = 88 ranks, model 7 on 14 x 8 = 112,
640 in all; ``keep_last`` unset = 3): a checkpoint of an 88-rank model has 90 files, model 7's 114 (DCP's
``FileSystemWriter`` with ``single_file_per_rank=True`` and the default ``thread_count=1`` writes one file per rank,
torch/distributed/checkpoint/filesystem.py ``write_data``; :func:`clustertrain.train.checkpoint_async.file_writer`),
and a single 640-rank job's 642 files (issue 38's "640 x 640"). Figures are ratios against the old rule.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import ROOT, Bench, Ratio

KINDS = ("open", "listdir", "scandir", "stat")
#: the flagship's jobs (examples/p5e-80x7.yaml): (name, jobs, ranks per job); files per checkpoint = ranks + 2
FLAGSHIP = (("models 1-6 (each)", 6, 88), ("model 7", 1, 112))


class FileOps:
    """Counts this process's file-system operations on paths under ``root`` while active (``with``; ``reset``
    between measurements): ``open``/``listdir``/``scandir`` from the audit events CPython raises (``open`` for the
    builtin and ``os.open``), ``stat`` from pass-through wrappers of ``os.stat``/``os.lstat`` and of the entries
    ``os.scandir`` yields (their first ``stat()``, which is the one system call ``DirEntry`` makes). One per
    process: an audit hook cannot be removed, so the hook stays and counts only while active."""

    def __init__(self, root: Path):
        self.root, self.on = str(root), False
        self.counts = dict.fromkeys((*KINDS, "data"), 0)
        sys.addaudithook(self._audit)

    def reset(self) -> dict[str, int]:
        """The counts so far (``data``: the opens of DCP data files, ``*.distcp``, also counted in ``open``); zeroes
        them."""
        counts, self.counts = self.counts, dict.fromkeys((*KINDS, "data"), 0)
        return counts

    def _mine(self, path) -> bool:
        return self.on and isinstance(path, (str, bytes, os.PathLike)) and os.fsdecode(path).startswith(self.root)

    def _audit(self, event: str, args: tuple) -> None:
        if event in ("open", "os.listdir", "os.scandir") and args and self._mine(args[0]):
            self.counts[event.removeprefix("os.")] += 1
            if event == "open" and os.fsdecode(args[0]).endswith(".distcp"):
                self.counts["data"] += 1

    def __enter__(self) -> FileOps:
        self._real = os.stat, os.lstat, os.scandir
        real_stat, real_lstat, real_scandir = self._real

        def stat(path, *a, **kw):
            if self._mine(path):
                self.counts["stat"] += 1
            return real_stat(path, *a, **kw)

        def lstat(path, *a, **kw):
            if self._mine(path):
                self.counts["stat"] += 1
            return real_lstat(path, *a, **kw)

        def scandir(path="."):
            it = real_scandir(path)
            return _Scan(it, self) if self._mine(path) else it

        os.stat, os.lstat, os.scandir, self.on = stat, lstat, scandir, True
        return self

    def __exit__(self, *exc) -> None:
        os.stat, os.lstat, os.scandir = self._real
        self.on = False


class _Scan:
    """``os.scandir``'s iterator, yielding entries whose first ``stat()`` is counted."""

    def __init__(self, it, ops: FileOps):
        self._it, self._ops = it, ops

    def __iter__(self):
        return self

    def __next__(self):
        return _Entry(next(self._it), self._ops)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._it.close()

    def close(self):
        self._it.close()


class _Entry:
    def __init__(self, entry: os.DirEntry, ops: FileOps):
        self._entry, self._ops, self._statted = entry, ops, False

    def __getattr__(self, name):
        return getattr(self._entry, name)

    def __fspath__(self):
        return self._entry.__fspath__()

    def stat(self, *, follow_symlinks: bool = True):
        if not self._statted and self._ops.on:
            self._ops.counts["stat"] += 1
            self._statted = True
        return self._entry.stat(follow_symlinks=follow_symlinks)


# -- the ranks' side ------------------------------------------------------------------------------
def old_rule(mgr, state: dict):
    """The resume before issue 38, on every rank: ownership, then the damage scan down the candidates until one
    passes, then :meth:`CheckpointManager.load` (``meta.json`` read again, DCP's load)."""
    from clustertrain.core.checkpoint_format import check_ownership, damage, resume_candidates

    check_ownership(mgr.root, mgr.fingerprint, mgr.project, mgr.model_name)
    for path in resume_candidates(mgr.root):
        if damage(path) is None:
            return path, mgr.load(path, state)
    raise RuntimeError(f"{mgr.root}: no sound checkpoint")


def replicated_per_parameter(path: Path) -> float:
    """Entries of the checkpoint ``path`` that every rank holds whole (per parameter tensor: the AdamW ``step`` and
    the per-parameter hyper-parameters of format 3), over the model's parameter tensors."""
    from torch.distributed.checkpoint import FileSystemReader

    keys = list(FileSystemReader(str(path)).read_metadata().state_dict_metadata)
    params = sum(1 for k in keys if k.startswith("model_optim.model."))
    shared = sum(1 for k in keys if ".optim.param_groups." in k or (".optim.state." in k and k.endswith(".step")))
    return shared / params


def rank_main(work: Path, out: Path, keep: int) -> None:
    import datetime

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from clustertrain.train.checkpoint import CheckpointManager
    from clustertrain.train.checkpoint_state import TrainState, app_state

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(4)])
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def manager(root: Path, zero_stage: int = 3) -> CheckpointManager:
        # zero_stage 3: the FSDP layout the trainer writes with (replicated entries in the lowest rank's file);
        # 0: as every layout was saved before (spread over the ranks' files)
        return CheckpointManager(root, keep_last=keep, fingerprint="f", project="p", model_name="m", rank=rank,
                                 world_size=world, layout={"zero_stage": zero_stage, "world": world})

    today, current = work / "checkpoints", work / "checkpoints-rank0"
    for step in range(1, keep + 1):
        model(torch.randn(8, 32)).square().mean().backward()
        opt.step()
        opt.zero_grad()
        state = app_state(model, opt, TrainState(step, 8 * step))
        manager(today, zero_stage=0).save(step, 8 * step, state)
        manager(current).save(step, 8 * step, state)
    dist.barrier()
    ops, report = FileOps(work), {"rank": rank}
    for rule, root in (("old", today), ("decide", today), ("current", current)):
        ts = TrainState()  # a fresh manager each, as a restarted rank has
        with ops:
            if rule == "old":
                path, _ = old_rule(manager(root, zero_stage=0), app_state(model, opt, ts))
            else:
                path = manager(root, zero_stage=0 if root == today else 3).load_latest(app_state(model, opt, ts)).path
        report[rule] = {"counts": ops.reset(), "step": ts.step, "path": path.name}
        dist.barrier()
    if rank == 0:
        newest = sorted(today.glob("step_*"))[-1]
        report["files"] = sum(1 for _ in newest.iterdir())
        report["replicated"] = replicated_per_parameter(newest)
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


# -- the driver -----------------------------------------------------------------------------------
RULES = ("old", "decide", "current")


def run_world(world: int, keep: int, tmp: Path) -> list[dict]:
    from clustertrain.launch.local_ranks import free_port

    work = tmp / f"w{world}"
    out = work / "out"
    out.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world), OMP_NUM_THREADS="1",
               PYTHONWARNINGS="ignore")
    argv = [sys.executable, __file__, "--rank", "--work", str(work), "--out", str(out), "--keep", str(keep)]
    procs = [subprocess.Popen(argv, env={**env, "RANK": str(r)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for r in range(world)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    if any(p.returncode for p in procs):
        sys.exit(f"a rank failed at world {world}:\n" + "\n".join(o[-2000:] for o in outs))
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
    for rep in reports:
        for rule in RULES:
            if rep[rule]["step"] != keep or rep[rule]["path"] != f"step_{keep:08d}":
                sys.exit(f"world {world} rank {rep['rank']}: the {rule} rule resumed {rep[rule]} instead of step {keep}")
    return reports


def flagship_tensors() -> dict[str, int]:
    """Parameter tensors of the flagship's models (examples/p5e-80x7.yaml, built on the meta device)."""
    import torch

    from clustertrain.resolve import load_project
    from clustertrain.train.model import GPT

    found = {}
    for entry in load_project(ROOT / "examples" / "p5e-80x7.yaml").models:
        with torch.device("meta"):
            found[entry.name] = len(list(GPT(entry.model, entry.model.vocab or 32000).parameters()))
    return found


def fit(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least-squares ``a + b x``; returns a, b and the largest absolute residual."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    a = my - b * mx
    return a, b, max(abs(a + b * x - y) for x, y in zip(xs, ys))


def total(counts: dict[str, int]) -> int:
    return sum(counts[k] for k in KINDS)


def fmt(counts: dict[str, float]) -> str:
    return (f"{counts['open']:g} open ({counts['data']:g} data) {counts['listdir'] + counts['scandir']:g} list "
            f"{counts['stat']:g} stat = {total(counts):g}")


def main() -> int:
    if "--rank" in sys.argv:  # one rank of run_world (no bench header)
        ap = argparse.ArgumentParser()
        ap.add_argument("--rank", action="store_true")
        ap.add_argument("--work", type=Path)
        ap.add_argument("--out", type=Path)
        ap.add_argument("--keep", type=int)
        a = ap.parse_args()
        rank_main(a.work, a.out, a.keep)
        return 0
    bench = Bench("restart_stats", __doc__, rounds=1)
    bench.parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4, 8],
                              help="gloo world sizes (at least two)")
    bench.parser.add_argument("--keep", type=int, default=3,
                              help="checkpoints saved and kept (keep_last; the flagship's is 3)")
    args = bench.parse()
    if bench.smoke:  # one world: proves the ranks, the counting and the rules run (no fit, no extrapolation)
        args.worlds, args.keep = [2], 2
    elif len(set(args.worlds)) < 2 or min(args.worlds) < 2:
        print(f"error: --worlds {' '.join(map(str, args.worlds))}: give at least two different sizes >= 2 "
              "(the extrapolation fits a line through them)", file=sys.stderr)
        return 2
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ct-restart-stats-") as tmp:
        rows = {world: run_world(world, args.keep, Path(tmp)) for world in sorted(set(args.worlds))}
    print(f"resume from {args.keep} kept checkpoints, FSDP2 on gloo CPU ranks ({time.monotonic() - started:.0f} s); "
          "operations under the checkpoint directory; old = every rank checks (reference), decide = rank 0 "
          "decides, current = decide + replicated entries saved in rank 0's file")
    print(f"{'world':>5} {'files':>5}  {'rule':8}  {'rank 0':40}  {'each other rank (max)':40}  {'all ranks':>9}  ÷ old")
    for world, reps in rows.items():
        old_all = sum(total(r["old"]["counts"]) for r in reps)
        for rule in RULES:
            zero, others = reps[0][rule]["counts"], [r[rule]["counts"] for r in reps[1:]]
            peak = {k: max(o[k] for o in others) for k in (*KINDS, "data")}
            all_ranks = sum(total(r[rule]["counts"]) for r in reps)
            print(f"{world:5d} {reps[0]['files']:5d}  {rule:8}  {fmt(zero):40}  {fmt(peak):40}  {all_ranks:9d}  "
                  f"{all_ranks / old_all:.3f}")
    for world, reps in rows.items():
        old_all = [sum(total(r["old"]["counts"]) for r in reps)]
        for rule in ("decide", "current"):
            bench.report(Ratio.of(f"{world} ranks, {rule} / old, operations per resume (all ranks)",
                                  [sum(total(r[rule]["counts"]) for r in reps)], old_all))
    if len(rows) < 2:
        return bench.finish()
    xs = [reps[0]["files"] for reps in rows.values()]
    fits = {}
    for rule in RULES:
        ys0 = [total(reps[0][rule]["counts"]) for reps in rows.values()]
        ysn = [sum(total(r[rule]["counts"]) for r in reps[1:]) / (w - 1) for w, reps in rows.items()]
        fits[rule] = fit(xs, ys0), fit(xs, ysn)
        (a0, b0, e0), (an, bn, en) = fits[rule]
        print(f"fit, {rule} (F = files per checkpoint): rank 0 {a0:.1f} + {b0:.2f} F, each other rank (mean) "
              f"{an:.1f} + {bn:.2f} F (largest residual {max(e0, en):.2g})")

    def predict(rule: str, ranks: int) -> float:
        (a0, b0, _), (an, bn, _) = fits[rule]
        return a0 + b0 * (ranks + 2) + (ranks - 1) * (an + bn * (ranks + 2))

    per_param = rows[max(rows)][0]["replicated"]
    tensors = flagship_tensors()
    print(f"replicated entries per parameter tensor (AdamW step + format 3's hyper-parameters): {per_param:g}; the "
          f"flagship's: {', '.join(f'{n} {t} tensors' for n, t in tensors.items() if n in ('model-1', 'model-7'))} -> "
          f"{min(tensors.values()) * per_param:,.0f}+ entries, more than any job's ranks: DCP's default planner spreads "
          "them over every rank's file, so each rank's load opens every file (the 'data' opens above) in old and "
          "decide alike")
    print("extrapolated to the flagship, operations per restart of a job (all its ranks; F = ranks + 2):")
    whole = dict.fromkeys(RULES, 0.0)
    for name, jobs, ranks in (*FLAGSHIP, ("one 640-rank job", 0, 640)):
        got = {rule: predict(rule, ranks) for rule in RULES}
        for rule in RULES:
            whole[rule] += jobs * got[rule]
        print(f"  {name:18s} {ranks:4d} ranks {ranks + 2:4d} files: old {got['old']:9,.0f}  decide "
              f"{got['decide']:9,.0f} (÷ old {got['decide'] / got['old']:.3f})  current {got['current']:7,.0f} "
              f"(÷ old {got['current'] / got['old']:.4f})")
    print(f"  the flagship's seven jobs restarting together (640 ranks): old {whole['old']:,.0f}  decide "
          f"{whole['decide']:,.0f} (÷ old {whole['decide'] / whole['old']:.3f})  current {whole['current']:,.0f} "
          f"(÷ old {whole['current'] / whole['old']:.4f})")
    for rule in ("decide", "current"):
        bench.report(Ratio.of(f"640 ranks (extrapolated), {rule} / old, operations per resume", [predict(rule, 640)],
                              [predict("old", 640)]))
    small, large = min(rows), max(rows)
    bench.report(Ratio.of(f"current, each other rank's operations, {large} ranks / {small} ranks",
                          [max(total(r["current"]["counts"]) for r in rows[large][1:])],
                          [max(total(r["current"]["counts"]) for r in rows[small][1:])], at_most=1.0,
                          note="constant per rank: O(files) on rank 0 only"))
    return bench.finish()


if __name__ == "__main__":
    sys.exit(main())
