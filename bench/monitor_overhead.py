"""Monitoring overhead: tokens/s with the node sampler (1 s interval) and per-rank step timing on, divided by
tokens/s with both off (`monitor.enabled: false`), measured side by side in one run.

    .venv/bin/python bench/monitor_overhead.py [--steps 80] [--repeats 3] [--procs 2]

Runs the real trainer (`clustertrain run`, gloo ranks on this machine) alternately off and on, `--repeats`
times each, same project, same seed. Tokens/s per run is the median of metrics.jsonl's `tokens_per_s` after
the first `--warmup` logged steps; the figure is median(on) / median(off) over the repeats (target >= 0.99).
On a 2-core machine the sampler shares the cores with the ranks, which is harsher than a GPU node, where the
ranks' work is on the GPUs and the node has 96+ cores.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PROJECT = """
name: bench
cluster: {{backend: local, gpus_per_node: 0, procs_per_node: {procs}, threads_per_worker: 1}}
storage: {{root: {root}}}
monitor: {{enabled: {enabled}, interval_s: 1}}
models:
  - name: m
    model: {{layers: 4, hidden: {hidden}, heads: 4, seq_len: 128}}
    training: {{max_steps: {steps}, micro_batch: 8, global_batch: {gb}, checkpoint_every: 100000, log_every: {log_every},
               seed: 1}}
"""


def tokens_per_s(workdir: Path, args, enabled: bool, tag: str) -> float:
    project = workdir / f"{tag}.yaml"
    project.write_text(PROJECT.format(procs=args.procs, root=json.dumps(str(workdir / "fsx")), hidden=args.hidden,
                                      steps=args.steps, gb=8 * args.procs, log_every=args.log_every,
                                      enabled=str(enabled).lower()))
    run_dir = workdir / tag
    subprocess.run([sys.executable, "-m", "clustertrain", "run", str(project), "--run-dir", str(run_dir)], check=True,
                   stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    if enabled:
        assert list((run_dir / "monitor").glob("*.csv")) and list((run_dir / "timing").glob("rank*.jsonl"))
    return statistics.median(r["tokens_per_s"] for r in rows[args.warmup:])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--log-every", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    off: list[float] = []
    on: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            off.append(tokens_per_s(Path(tmp), args, False, f"off-{r}"))
            on.append(tokens_per_s(Path(tmp), args, True, f"on-{r}"))
            print(f"repeat {r}: off {off[-1]:,.0f} tokens/s, on {on[-1]:,.0f} tokens/s", flush=True)
    ratio = statistics.median(on) / statistics.median(off)
    print(f"monitor on / off, tokens/s: {ratio:.3f} (target >= 0.99; median of {args.repeats} runs each, "
          f"{args.procs} gloo ranks, sampler every 1 s, per-rank timing every {args.log_every} steps)")


if __name__ == "__main__":
    main()
