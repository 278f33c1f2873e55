"""Trainer overhead: tokens/s of `clustertrain run` (the real trainer: DDP, grad clipping, schedule,
stop-flag agreement, metrics, TensorBoard) vs a bare PyTorch DDP loop of the same GPT, batch and
process count, measured side by side in one run (alternating, best of --repeats each).

    .venv/bin/python bench/trainer_overhead.py [--steps 80] [--repeats 3]

Both sides record the wall-clock end of every step; tokens/s comes from the median step-to-step time
after `warmup` steps, so everything the trainer does between steps counts against it. Both clip
gradients (the project's grad_clip); the trainer also runs its schedule, per-step stop-flag agreement,
sample index, and logs every step (all-reduced loss, metrics.jsonl, TensorBoard). Runs alternate
(bare, ours, bare, ours, ...); the figure per side is the median over runs. Target: ratio >= 0.97.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOG_EVERY = 1  # the trainer logs every step (all-reduced loss, metrics.jsonl, TensorBoard): harsher than a real run
PROJECT = """
name: bench
cluster: {{backend: local, gpus_per_node: 0, procs_per_node: {procs}}}
storage: {{root: {root}}}
models:
  - name: m
    model: {{layers: 4, hidden: 128, heads: 4, seq_len: 128}}
    training: {{max_steps: {steps}, micro_batch: 8, global_batch: {gb}, lr: 3.0e-3, warmup_steps: 5,
               checkpoint_every: 100000, log_every: {log_every}, seed: 1}}
"""


def bare_rank(args: argparse.Namespace) -> None:
    """One rank of the reference: the same model and batch, nothing else."""
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from clustertrain.train.config import ArchConfig
    from clustertrain.train.model import GPT, loss_fn

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}", rank=rank, world_size=world)
    torch.manual_seed(1)
    arch = ArchConfig(layers=4, hidden=128, heads=4, seq_len=128)
    model = DDP(GPT(arch, 320))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, foreach=True)
    rng = np.random.default_rng(rank)
    tokens = torch.from_numpy(rng.integers(0, 256, size=(args.steps, 8, 129)).astype(np.int64))
    times = []
    for step in range(args.steps):
        batch = tokens[step]
        loss = loss_fn(model(batch[:, :-1]), batch[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # the same algorithm as the project's grad_clip
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.time())
    if rank == 0:
        print(json.dumps({"times": {step + 1: t for step, t in enumerate(times)}}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_bare(steps: int, procs: int) -> list[float]:
    port = free_port()
    ps = [subprocess.Popen([sys.executable, __file__, "--bare-rank", "--steps", str(steps)], stdout=subprocess.PIPE, text=True,
                           env=dict(os.environ, RANK=str(r), WORLD_SIZE=str(procs), MASTER_PORT=str(port)))
          for r in range(procs)]
    outs = [p.communicate()[0] for p in ps]
    assert all(p.returncode == 0 for p in ps), outs
    return json.loads(outs[0].strip().splitlines()[-1])["times"]


def run_trainer(steps: int, procs: int, workdir: Path) -> list[float]:
    project = workdir / "bench.yaml"
    project.write_text(PROJECT.format(procs=procs, root=json.dumps(str(workdir)), steps=steps, gb=8 * procs, log_every=LOG_EVERY))
    run_dir = workdir / f"run-{time.time_ns()}"
    subprocess.run([sys.executable, "-m", "clustertrain", "run", str(project), "--run-dir", str(run_dir)], check=True,
                   stdout=subprocess.DEVNULL)
    rows = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["time"] for r in rows}


def tokens_per_s(times: dict, warmup: int, last: int, procs: int) -> float:
    """Tokens/s from the median wall-clock time between consecutive step ends after `warmup`
    (the median keeps one hiccup of a busy 2-core machine from deciding the result)."""
    times = {int(k): v for k, v in times.items()}
    gaps = sorted(times[i + 1] - times[i] for i in range(warmup, last))
    return 8 * procs * 128 / gaps[len(gaps) // 2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--bare-rank", action="store_true")
    args = ap.parse_args()
    if args.bare_rank:
        return bare_rank(args)
    ours, ref = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            ref.append(tokens_per_s(run_bare(args.steps, args.procs), args.warmup, args.steps, args.procs))
            ours.append(tokens_per_s(run_trainer(args.steps, args.procs, Path(tmp)), args.warmup, args.steps, args.procs))
    print(f"model: GPT 4x128, seq 128, micro_batch 8 per rank, {args.procs} gloo ranks, steps {args.warmup}..{args.steps}")
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    print(f"bare PyTorch DDP loop : {med(ref):10,.0f} tokens/s   (runs: {', '.join(f'{x:,.0f}' for x in ref)})")
    print(f"clustertrain train    : {med(ours):10,.0f} tokens/s   (runs: {', '.join(f'{x:,.0f}' for x in ours)})")
    print(f"ratio (ours / bare)   : {med(ours) / med(ref):.3f}   target >= 0.97")


if __name__ == "__main__":
    main()
