"""Control-plane start-up: how long torch.distributed ranks take from launch to their first collective over gloo,
with no extra gloo group and with one extra world-size gloo group (``dist.new_group(backend="gloo")``, what the
trainer's control group is), at 2, 4, 8 and 16 CPU ranks on this machine; then least-squares fits of how each part
grows with the ranks and what 640 ranks would take.

    flock /tmp/ct-heavy.lock .venv/bin/python bench/control_plane.py [--ranks 2 4 8 16] [--rounds 3]
    .venv/bin/python bench/control_plane.py --smoke     # 2 ranks, one round, then one 2-rank `clustertrain run`

Reference: the same ranks with no extra gloo group (the world group only), run in the same rounds. Each round runs
every (rank count, groups) pair once, the order reversed every other round (bench/harness.py ``interleave``: load
drift hits every pair alike). Figures ("measured", no target: issue 38 item 8 asked for the cost, not a bound), per
rank count: launch -> first collective with one extra group ÷ without, per round (median and spread), and the
extra group's own time; then the fits below.

What runs. Not the trainer: a faithful minimal rank (this file's ``--worker`` mode), started by clustertrain's own
local launcher (:func:`clustertrain.launch.local_ranks.start_local_ranks`, the environment and rendezvous variables
the trainer's ranks get), that does what :func:`clustertrain.train.distributed.init_process_group` does
(``init_process_group("gloo", init_method="tcp://MASTER:PORT")``), then the extra gloo group(s), then one
``all_reduce`` on each group. Each rank records wall-clock times (``time.time()``; all ranks share this machine's
clock) after ``import torch``, after the world group, after the extra group and after the first collectives.

The parts, each the slowest rank's (the run waits for it):

* ``launch -> imported``: interpreter + ``import torch``. On this 2-core machine 16 ranks import on 2 cores, so this
  part grows with the ranks here only because the CPUs are shared; on a cluster each rank has its own cores.
* ``world``: from the last rank's import to the world group being up on every rank (TCPStore rendezvous, whose
  clients retry with a back-off while rank 0's server is not up yet, + gloo's full-mesh connect: every pair of ranks
  connects through addresses exchanged in the store, rank 0's store serving them all).
* ``extra``: one more ``new_group(backend="gloo")`` after a barrier has aligned the ranks (another full mesh through
  the same store): the cost of one extra gloo group, free of the import skew.
* ``first``: the first ``all_reduce`` of one float on each group.
* ``c10d`` = world + extra + first (the control plane's part, without the imports); ``total``: launch -> first
  collective done on every rank.

Fits: ``t = a + b*n`` and ``t = a + b*n + c*n^2`` by least squares over every run (numpy.linalg.lstsq), for c10d with
one group (the world only) and with two, and for the extra group alone; the prediction at 640 ranks is printed with
its standard error (the parameters' covariance from the residual variance, plus one run's scatter). With 4 rank
counts the quadratic term is poorly determined; the error says how poorly. These are measurements on one machine
over loopback: on a cluster the per-pair connects run in parallel on separate nodes, while rank 0's TCPStore still serves every rank's lookups (n*(n-1) gets per full mesh).

``--trainer``: the real trainer instead of the minimal rank.

    flock /tmp/ct-heavy.lock .venv/bin/python bench/control_plane.py --trainer [--ranks 2 4 8 16] [--rounds 2]

Each run is ``clustertrain run`` (a subprocess, as a user types it) on a tiny CPU project (the model of
``tests/integration/train/conftest.py``'s TINY: 2 layers, hidden 64; ``cluster.procs_per_node`` = n,
``threads_per_worker: 1``, micro_batch 2, global_batch 2n so that every rank does the same work at each size,
``max_steps: 2``, no checkpoint before the end, the monitor on, ``async_checkpoint: false``). Without that last
setting each rank also spawns its checkpoint writer process at start-up (:mod:`clustertrain.train.checkpoint_async`:
another interpreter importing torch and joining a gloo world of the writers), which on a cluster runs beside its rank
on the rank's own node but here doubles the load on 2 CPUs; a run of two steps never uses it (the last save of a run
is synchronous). ``--async-writers`` keeps it on. The times come from the run's own record,
``RUN_DIR/usage.json``'s attempt (:class:`clustertrain.core.run_events.Attempt`, written by
:mod:`clustertrain.train.run_recorder`), against the bench's clock just before the subprocess starts:

* ``cli``: launch -> ``allocated`` (the local launcher's time just before it starts the ranks): the CLI's imports,
  loading the project, preparing the run directory.
* ``ranks``: ``allocated`` -> ``started`` (rank 0 made its run record, the last thing the Trainer's constructor
  does): every rank's interpreter and imports (torch), the rendezvous and gloo's full mesh for the default group
  (on CPU ranks the trainer's control group, :mod:`clustertrain.train.control`), the synthetic data opened, the
  model built and DDP's parameter broadcast, the gather of node names.
* ``step``: ``started`` -> ``first_step`` (rank 0's first step finished: forward, backward, the gradient all_reduce,
  the optimizer).
* ``total``: launch -> first step; ``cpu/rank``: the CPU seconds of the whole run (every process, to its end) per
  rank, from ``resource.getrusage(RUSAGE_CHILDREN)``: the work a cluster runs in parallel, one rank per core.

The rank counts run in alternating order (2 4 8 16, 16 8 4 2, ...). Figures ("measured"): launch -> first step
at each rank count, in seconds, and ÷ the 2-rank (smallest) run of the same round. Fits as above, per part and for the
total. On this 2-CPU machine n ranks' imports and model builds run on 2 CPUs,
so ``ranks`` grows linearly with n here; on a cluster each node does its own ranks' share in parallel and only the
rendezvous through rank 0's TCPStore (its n clients, and the n*(n-1) lookups of gloo's full mesh) and the
collectives grow with n.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import statistics
import sys
import tempfile
import time
from pathlib import Path

from harness import ROOT, Bench, Ratio, interleave

PARTS = ("imported", "world", "aligned", "extra", "first")
COLUMNS = ("imported", "world", "extra", "first", "c10d", "total")
#: one `clustertrain run` of the tiny project (16 ranks take ~1 min here); past this it is killed
RUN_TIMEOUT_S = 240
TRAINER_COLUMNS = ("cli", "ranks", "step", "total", "cpu/rank")
#: the tiny CPU project of tests/integration/train/conftest.py (TINY), sized per rank count
TRAINER_PROJECT = """\
name: ctrlplane
cluster: {{backend: local, gpus_per_node: 0, procs_per_node: {n}, threads_per_worker: 1}}
storage: {{root: {root}}}
models:
  - name: tiny
    model: {{layers: 2, hidden: 64, heads: 4, seq_len: 64, dropout: 0.1}}
    training: {{max_steps: 2, micro_batch: 2, global_batch: {batch}, lr: 3.0e-3, min_lr: 3.0e-4, warmup_steps: 1,
               checkpoint_every: 1000, keep_last: 1, log_every: 1, seed: 7, async_checkpoint: {async_ckpt}}}
"""


def worker(out: Path, extra_groups: int) -> None:
    """One rank: the world group as the trainer makes it, ``extra_groups`` gloo groups, one all_reduce on each."""
    t_start = time.time()
    import datetime

    import torch
    import torch.distributed as dist

    t_imported = time.time()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                            rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300))
    t_world = time.time()
    dist.barrier()  # align the ranks, so that the extra group's time is its own, not the slowest import's
    t_aligned = time.time()
    groups = [dist.new_group(backend="gloo") for _ in range(extra_groups)]
    t_extra = time.time()
    x = torch.ones(1)
    dist.all_reduce(x)
    for g in groups:
        dist.all_reduce(x, group=g)
    t_first = time.time()
    assert x.item() == world ** (1 + extra_groups), x.item()  # every rank took part in every collective
    record = {"rank": rank, "start": t_start, "imported": t_imported, "world": t_world, "aligned": t_aligned, "extra": t_extra,
              "first": t_first}
    with open(out, "a") as f:
        f.write(json.dumps(record) + "\n")
    dist.barrier()
    dist.destroy_process_group()


def run_once(world: int, extra_groups: int, tmp: Path) -> dict[str, float]:
    """Start ``world`` ranks with the local launcher; the parts' durations (slowest rank) in seconds."""
    from clustertrain.launch.local_ranks import reap_ranks, start_local_ranks

    out = tmp / f"times-{world}-{extra_groups}-{time.monotonic_ns()}.jsonl"
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", str(out), "--extra-groups", str(extra_groups)]
    t_launch = time.time()
    procs = start_local_ranks(argv, world, lambda r: tmp / f"rank{r}.log")
    reap_ranks(procs.values(), grace=300)
    failed = {r: p.returncode for r, p in procs.items() if p.returncode}
    if failed:
        log = (tmp / f"rank{min(failed)}.log").read_text()[-1500:]
        raise SystemExit(f"{world} ranks, {extra_groups} extra group(s): ranks failed {failed}:\n{log}")
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(recs) == world, f"{len(recs)} of {world} ranks reported"
    last = {k: max(r[k] for r in recs) for k in PARTS}
    parts = {"imported": last["imported"] - t_launch, "world": last["world"] - last["imported"],
             "extra": last["extra"] - last["aligned"], "first": last["first"] - last["extra"]}
    return {**parts, "c10d": parts["world"] + parts["extra"] + parts["first"], "total": last["first"] - t_launch}


def trainer_once(world: int, tmp: Path, async_ckpt: bool = False) -> dict[str, float]:
    """One ``clustertrain run`` of the tiny project on ``world`` CPU ranks; its parts (seconds) from usage.json."""
    from clustertrain.core.run_events import read_usage
    from clustertrain.core.run_paths import RunPaths

    tag = f"{world}-{time.monotonic_ns()}"
    project = tmp / f"project-{tag}.yaml"
    project.write_text(TRAINER_PROJECT.format(n=world, batch=2 * world, root=json.dumps(str(tmp / f"fsx-{tag}")),
                                           async_ckpt=json.dumps(async_ckpt)))
    run_dir = tmp / f"run-{tag}"
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t_launch = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "clustertrain", "run", str(project), "--run-dir", str(run_dir)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the CLI's session; its ranks die with it (launch/local_ranks.py)
        out, _ = proc.communicate()
        raise SystemExit(f"{world} ranks: `clustertrain run` still running after {RUN_TIMEOUT_S} s (killed); "
                         f"rank logs were in {run_dir / 'logs'}:\n{out[-2000:]}")
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(f"{world} ranks: `clustertrain run` failed (exit {proc.returncode}):\n{out[-2000:]}")
    attempts = read_usage(RunPaths(run_dir)).attempts
    assert len(attempts) == 1 and attempts[0].world_size == world, attempts
    a = attempts[0]
    assert a.allocated is not None and a.first_step is not None, a  # the local launcher's start, the first step
    cpu = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
    return {"cli": a.allocated - t_launch, "ranks": a.started - a.allocated, "step": a.first_step - a.started,
            "total": a.first_step - t_launch, "cpu/rank": cpu / world}


def trainer_main(bench: Bench, args: argparse.Namespace) -> None:
    results: dict[int, list[dict[str, float]]] = {}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ct-control-plane-trainer-") as tmp:

        def side(n: int):
            def run() -> float:
                results.setdefault(n, []).append(trainer_once(n, Path(tmp), args.async_writers))
                return results[n][-1]["total"]
            return run

        # alternate the sizes' order between rounds, so that machine load hits them alike
        totals = interleave({n: side(n) for n in args.ranks}, bench.rounds)
    print(f"trainer start-up to first step (`clustertrain run`, CPU gloo ranks, threads_per_worker 1, "
          f"async_checkpoint {'on' if args.async_writers else 'off'}), "
          f"{os.cpu_count()} CPUs, median of {bench.rounds} (bench took {time.monotonic() - t0:.0f} s)")
    print(f"  {'ranks':>5}  " + "  ".join(f"{c:>8}" for c in TRAINER_COLUMNS))
    for n, runs in sorted(results.items()):
        med = {k: statistics.median(r[k] for r in runs) for k in TRAINER_COLUMNS}
        print(f"  {n:>5}  " + "  ".join(f"{med[c]:8.3f}" for c in TRAINER_COLUMNS))
    if len(results) > 1:
        print(f"fits over every run (least squares), extrapolated to {args.at} ranks:")
    for part in ("total", "ranks", "cli", "step", "cpu/rank"):
        ns = [n for n, runs in results.items() for _ in runs]
        ts = [r[part] for runs in results.values() for r in runs]
        for degree, name in ((1, "linear"), (2, "quadratic")):
            if len(set(ns)) <= degree:
                continue  # too few rank counts to fit this degree
            coef, pred, se = fit(ns, ts, degree, args.at)
            terms = " + ".join(f"{c:.3g}*n^{k}" if k else f"{c:.3g}" for k, c in enumerate(coef))
            print(f"  {part:<9} {name:<9}  t = {terms}   -> {args.at}: {pred:8.2f} s +- {se:.2f}")
    per_rank = statistics.median(r["cpu/rank"] for runs in results.values() for r in runs)
    print(f"  on a cluster the ranks' own work runs in parallel (one rank per core): ~{per_rank:.1f} CPU-s per rank "
          f"for the whole run, whatever n; what stays serial is rank 0's TCPStore and the collectives")
    smallest = min(args.ranks)
    for n in args.ranks:
        bench.report(Ratio(f"trainer, {n} ranks, launch -> first step", totals[n], unit=" s"))
        if n != smallest:
            bench.report(Ratio.of(f"trainer, launch -> first step, {n} ranks / {smallest} ranks", totals[n],
                                  totals[smallest]))


def fit(ns: list[int], ts: list[float], degree: int, at: int = 640) -> tuple[list[float], float, float]:
    """Least squares ``t = sum c_k n^k`` (k = 0..degree): (coefficients, prediction at ``at``, its standard error)."""
    import numpy as np

    x = np.asarray(ns, dtype=float)
    y = np.asarray(ts, dtype=float)
    a = np.vander(x, degree + 1, increasing=True)
    coef, _, _, _ = np.linalg.lstsq(a, y, rcond=None)
    dof = max(1, len(y) - (degree + 1))
    sigma2 = float(((y - a @ coef) ** 2).sum()) / dof
    cov = sigma2 * np.linalg.pinv(a.T @ a)
    v = np.vander(np.asarray([float(at)]), degree + 1, increasing=True)[0]
    pred = float(v @ coef)
    se = float(np.sqrt(max(0.0, v @ cov @ v) + sigma2))  # parameters' uncertainty plus one run's scatter
    return [float(c) for c in coef], pred, se


def minimal_main(bench: Bench, args: argparse.Namespace) -> None:
    results: dict[tuple[int, int], list[dict[str, float]]] = {}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ct-control-plane-") as tmp:

        def side(n: int, extra: int):
            def run() -> float:
                results.setdefault((n, extra), []).append(run_once(n, extra, Path(tmp)))
                return results[(n, extra)][-1]["total"]
            return run

        # every (ranks, groups) pair once per round, the order reversed every other round
        totals = interleave({(n, extra): side(n, extra) for n in args.ranks for extra in (0, 1)}, bench.rounds)
    print(f"control-plane start-up, {os.cpu_count()} CPUs, torch gloo over loopback, median of {bench.rounds} "
          f"(bench took {time.monotonic() - t0:.0f} s)")
    print(f"  {'ranks':>5}  {'groups':>6}  " + "  ".join(f"{c:>8}" for c in COLUMNS))
    for (n, extra), runs in sorted(results.items()):
        med = {k: statistics.median(r[k] for r in runs) for k in COLUMNS}
        print(f"  {n:>5}  {1 + extra:>6}  " + "  ".join(f"{med[c]:8.3f}" for c in COLUMNS))
    if len(args.ranks) > 1:
        print(f"fits over every run (least squares), extrapolated to {args.at} ranks:")
    for part, variant in (("c10d", 0), ("c10d", 1), ("extra", 1)):
        ns = [n for (n, e), runs in results.items() if e == variant for _ in runs]
        ts = [r[part] for (n, e), runs in results.items() if e == variant for r in runs]
        for degree, name in ((1, "linear"), (2, "quadratic")):
            if len(set(ns)) <= degree:
                continue  # too few rank counts to fit this degree
            coef, pred, se = fit(ns, ts, degree, args.at)
            terms = " + ".join(f"{c:.3g}*n^{k}" if k else f"{c:.3g}" for k, c in enumerate(coef))
            label = {"c10d": f"c10d, {1 + variant} group(s)", "extra": "extra group"}[part]
            print(f"  {label:<20} {name:<9}  t = {terms}   -> {args.at}: {pred:7.2f} s +- {se:.2f}")
    for n in args.ranks:
        bench.report(Ratio.of(f"{n} ranks, launch -> first collective, one extra gloo group / none", totals[(n, 1)],
                              totals[(n, 0)]))
        bench.report(Ratio(f"{n} ranks, one extra gloo group's own time", [r["extra"] for r in results[(n, 1)]],
                           unit=" s"))


def main() -> int:
    if "--worker" in sys.argv:  # one rank of run_once (no bench header)
        ap = argparse.ArgumentParser()
        ap.add_argument("--worker", type=Path)
        ap.add_argument("--extra-groups", type=int, default=0)
        a = ap.parse_args()
        worker(a.worker, a.extra_groups)
        return 0
    bench = Bench("control_plane", __doc__, rounds=3)
    ap = bench.parser
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8, 16])
    ap.add_argument("--trainer", action="store_true",
                    help="time the real trainer (`clustertrain run` on a tiny CPU project) to its first step")
    ap.add_argument("--async-writers", action="store_true",
                    help="with --trainer: keep training.async_checkpoint on (a writer process per rank at start-up)")
    ap.add_argument("--at", type=int, default=640, help="rank count to extrapolate to")
    args = bench.parse()
    if bench.smoke:  # both modes at 2 ranks, one run each
        args.ranks = [2]
        minimal_main(bench, args)
        trainer_main(bench, args)
    elif args.trainer:
        trainer_main(bench, args)
    else:
        minimal_main(bench, args)
    return bench.finish()


if __name__ == "__main__":
    sys.exit(main())
