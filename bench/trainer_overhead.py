"""Trainer overhead: tokens/s of `clustertrain run` (the real trainer: DDP, grad clipping, schedule,
stop-flag agreement, metrics, TensorBoard) vs a bare PyTorch DDP loop of the same GPT, batch and
process count, measured side by side in one run (alternating, best of --repeats each).

    .venv/bin/python bench/trainer_overhead.py [--steps 80] [--repeats 3]

Both sides time the same step window by wall clock (end of step `warmup` to end of the last step), so
everything the trainer does between steps counts against it. Both clip gradients (the project's
grad_clip); the trainer also runs its schedule, per-step stop-flag agreement, data index and logging
every 10 steps. Target: ratio >= 0.97.
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
LOG_EVERY = 10  # the trainer logs (all-reduced loss, metrics.jsonl, TensorBoard) every 10 steps, as a real run would
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

    from clustertrain.project import ArchConfig
    from clustertrain.train.model import GPT

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
        loss = model(batch[:, :-1], batch[:, 1:])
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
    """Wall-clock tokens/s between the end of step `warmup` and the end of step `last`."""
    times = {int(k): v for k, v in times.items()}
    return (last - warmup) * 8 * procs * 128 / (times[last] - times[warmup])


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
    print(f"bare PyTorch DDP loop : {max(ref):10,.0f} tokens/s   (runs: {', '.join(f'{x:,.0f}' for x in ref)})")
    print(f"clustertrain train    : {max(ours):10,.0f} tokens/s   (runs: {', '.join(f'{x:,.0f}' for x in ours)})")
    print(f"ratio (ours / bare)   : {max(ours) / max(ref):.3f}   target >= 0.97")


if __name__ == "__main__":
    main()
