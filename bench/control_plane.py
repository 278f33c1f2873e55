"""Control-plane start-up: how long torch.distributed ranks take from launch to their first collective over gloo,
with no extra gloo group and with one extra world-size gloo group (``dist.new_group(backend="gloo")``, what the
trainer's control group is), at 2, 4, 8 and 16 CPU ranks on this machine; then least-squares fits of how each part
grows with the ranks and what 640 ranks would take.

    flock /tmp/ct-heavy.lock .venv/bin/python bench/control_plane.py [--ranks 2 4 8 16] [--repeats 3]

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
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PARTS = ("imported", "world", "aligned", "extra", "first")
COLUMNS = ("imported", "world", "extra", "first", "c10d", "total")


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8, 16])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--at", type=int, default=640, help="rank count to extrapolate to")
    ap.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--extra-groups", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.extra_groups)
        return
    results: dict[tuple[int, int], list[dict[str, float]]] = {}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ct-control-plane-") as tmp:
        for _ in range(args.repeats):  # alternate sizes and variants so that machine load hits them alike
            for n in args.ranks:
                for extra in (0, 1):
                    results.setdefault((n, extra), []).append(run_once(n, extra, Path(tmp)))
    print(f"control-plane start-up, {os.cpu_count()} CPUs, torch gloo over loopback, median of {args.repeats} "
          f"(bench took {time.monotonic() - t0:.0f} s)")
    print(f"  {'ranks':>5}  {'groups':>6}  " + "  ".join(f"{c:>8}" for c in COLUMNS))
    for (n, extra), runs in sorted(results.items()):
        med = {k: statistics.median(r[k] for r in runs) for k in COLUMNS}
        print(f"  {n:>5}  {1 + extra:>6}  " + "  ".join(f"{med[c]:8.3f}" for c in COLUMNS))
    print("  one extra gloo world group vs none (median total, s): " + ", ".join(
        f"{n}: {statistics.median(r['total'] for r in results[(n, 1)]):.2f} vs "
        f"{statistics.median(r['total'] for r in results[(n, 0)]):.2f}" for n in args.ranks))
    print(f"fits over every run (least squares), extrapolated to {args.at} ranks:")
    for part, variant in (("c10d", 0), ("c10d", 1), ("extra", 1)):
        ns = [n for (n, e), runs in results.items() if e == variant for _ in runs]
        ts = [r[part] for (n, e), runs in results.items() if e == variant for r in runs]
        for degree, name in ((1, "linear"), (2, "quadratic")):
            coef, pred, se = fit(ns, ts, degree, args.at)
            terms = " + ".join(f"{c:.3g}*n^{k}" if k else f"{c:.3g}" for k, c in enumerate(coef))
            label = {"c10d": f"c10d, {1 + variant} group(s)", "extra": "extra group"}[part]
            print(f"  {label:<20} {name:<9}  t = {terms}   -> {args.at}: {pred:7.2f} s +- {se:.2f}")


if __name__ == "__main__":
    main()
