"""Bench: our gloo all_reduce bus bandwidth on 2 local processes vs this machine's memory-copy bandwidth (the named
reference: a numpy copy of the same buffer, read + write, like a reduction's data movement).

    flock /tmp/ct-heavy.lock .venv/bin/python bench/collectives.py [--size 64M] [--iters 10] [--rounds 3]
    .venv/bin/python bench/collectives.py --smoke          # 1 MiB, 2 iterations, one round, nothing judged

Each round measures both sides (interleaved: bench/harness.py): the best of 10 numpy copies of ``--size`` bytes,
and ``clustertrain.validate.run_collectives`` (all_reduce, ``--size`` bytes, 2 local gloo ranks started for the
round; its nccl-tests-style busbw). No target: the ratio busbw ÷ memcpy GB/s is printed as a ``measured`` figure
(gloo over loopback TCP on CPU says nothing about NCCL on GPUs; ``clustertrain validate`` on a cluster does).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Bench, Ratio, interleave  # noqa: E402  (puts the repository on sys.path)

from clustertrain.validate import CollectivesConfig, parse_size, run_collectives  # noqa: E402


def memcpy_gbps(nbytes: int, reps: int = 10) -> float:
    src = np.ones(nbytes // 8, dtype=np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def main() -> int:
    bench = Bench("collectives", __doc__, rounds=3)
    bench.parser.add_argument("--size", default="64M", help="buffer size (default 64M)")
    bench.parser.add_argument("--iters", type=int, default=10)
    args = bench.parse()
    size = parse_size("1M" if bench.smoke else args.size)
    iters = 2 if bench.smoke else args.iters
    rows = []

    def gloo() -> float:
        run = run_collectives(CollectivesConfig(ops=["all_reduce"], min_bytes=size, max_bytes=size, iters=iters,
                                                warmup=1 if bench.smoke else 2, nproc=2, timeout_s=120))
        if run.failed:
            raise SystemExit(f"collectives failed: {run.problems}")
        rows.append(run.reports[0].rows[-1])
        return rows[-1].busbw_gbps

    rates = interleave({"gloo": gloo, "memcpy": lambda: memcpy_gbps(size)}, rounds=args.rounds)
    print(f"{size:,} bytes: memcpy GB/s per round {', '.join(f'{x:.2f}' for x in rates['memcpy'])}; gloo all_reduce "
          f"busbw GB/s {', '.join(f'{x:.3f}' for x in rates['gloo'])} (2 procs; times "
          f"{', '.join(f'{r.time_us / 1e3:.1f}' for r in rows)} ms)")
    bench.report(Ratio.of("collectives gloo all_reduce busbw / memcpy GB/s", rates["gloo"], rates["memcpy"]))
    return bench.finish()


if __name__ == "__main__":
    sys.exit(main())
