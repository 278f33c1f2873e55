"""Bench: our gloo all_reduce bus bandwidth on 2 local processes vs this machine's memory-copy bandwidth.

Both are measured in the same run: numpy copy of a large buffer (read + write, like a reduction's
data movement), then run_collectives(all_reduce) on 2 local gloo ranks. Prints both and the ratio.
Run: PYTHONPATH=. .venv/bin/python bench/collectives.py [--size 64M]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from clustertrain.validate import CollectivesConfig, parse_size, run_collectives


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="64M", help="buffer size (default 64M)")
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    size = parse_size(args.size)
    mem = memcpy_gbps(size)
    run = run_collectives(CollectivesConfig(ops=["all_reduce"], min_bytes=size, max_bytes=size, iters=args.iters,
                                            warmup=2, nproc=2, timeout_s=120))
    if run.failed:
        raise SystemExit(f"collectives failed: {run.problems}")
    row = run.reports[0].rows[-1]
    print(f"memory copy (numpy, {args.size}):           {mem:8.2f} GB/s")
    print(f"gloo all_reduce busbw (2 procs, {args.size}):  {row.busbw_gbps:8.3f} GB/s  (time {row.time_us / 1e3:.1f} ms)")
    print(f"ratio busbw / memcpy:                    {row.busbw_gbps / mem:8.3f}")


if __name__ == "__main__":
    main()
