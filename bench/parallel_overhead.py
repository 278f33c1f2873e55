"""Parallelism overhead: tokens/s of FSDP2 and of dp 2 x tp 2 vs DDP, same model, batch and 4 gloo ranks,
measured side by side in one run.

    .venv/bin/python bench/parallel_overhead.py [--steps 12] [--warmup 3] [--repeats 2] [--procs 4]

The model and batch are the model-7 twin's (``examples/model7-twin.yaml``: GPT 4 x 160, seq 128, micro_batch
1, global_batch 8); ``--project`` picks another project file's first model. One set of ``--procs`` CPU ranks
(gloo, one thread each) builds every layout through the trainer's ``build_parallel_model`` and optimizer:

  ddp         zero_stage 0 (the reference)
  fsdp        zero_stage 3 with the twin's reshard_after_forward: false (model-7's layout)
  dp2xtp2     zero_stage 3, tp 2
  dp2xtp2-sp  zero_stage 3, tp 2, sequence_parallel, recompute selective (the twin's 2-D variant)

and trains each in turn with the body of ``Trainer._train_step`` (gradient accumulation to the global
batch, grad-norm clip, schedule, AdamW) on random tokens. Rounds alternate over the layouts (ddp, fsdp,
dp2xtp2, dp2xtp2-sp, ddp, ...); each layout's figure is the median over rounds of its median step time
after ``--warmup`` steps, measured on rank 0 between step ends. Printed: tokens/s per layout and its ratio
to DDP. No target: on CPU ranks the extra collectives of FSDP (a gather per block and micro-batch, a
reduce-scatter per block) and of tensor parallelism (two all-reduces, or with sequence parallelism two
all-gathers and two reduce-scatters, per block and micro-batch) cost latency that a tiny model cannot hide;
the figures say how much, for this model on this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from clustertrain.launch.local_ranks import free_port  # noqa: E402  (after the sys.path line)

LAYOUTS = {
    "ddp": {"zero_stage": 0},
    "fsdp": {"zero_stage": 3, "reshard_after_forward": False},
    "dp2xtp2": {"zero_stage": 3, "tp": 2, "reshard_after_forward": False},
    "dp2xtp2-sp": {"zero_stage": 3, "tp": 2, "sequence_parallel": True, "recompute": "selective",
                   "reshard_after_forward": False},
}


def rank_main(args: argparse.Namespace) -> None:
    """One rank: build every layout, then time them in alternating rounds; rank 0 prints the step times."""
    import torch
    import torch.distributed as dist

    from clustertrain.project import load_project
    from clustertrain.train.config import ParallelismConfig
    from clustertrain.train.layout import resolve_layout
    from clustertrain.train.model import padded_vocab
    from clustertrain.train.optim import build_optimizer, lr_at, set_lr
    from clustertrain.train.parallel import build_parallel_model

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}", rank=rank, world_size=world)
    entry = load_project(args.project).models[0]
    arch, cfg = entry.model, entry.training.model_copy(update={"max_steps": args.steps})
    vocab = padded_vocab(arch, 258)  # the byte tokenizer's vocabulary, as the twin's run pads it
    built = {}
    for name, fields in LAYOUTS.items():
        layout = resolve_layout(ParallelismConfig(**fields), world, on_gpu=False)
        pm = build_parallel_model(arch, vocab, layout, torch.device("cpu"), seed=cfg.seed)
        built[name] = (layout, pm, build_optimizer(pm.model, cfg))
    gen = torch.Generator().manual_seed(0)
    data = torch.randint(0, vocab, (args.steps * cfg.global_batch, arch.seq_len + 1), generator=gen)

    def run(layout, pm, opt) -> list[float]:
        accum = cfg.global_batch // (cfg.micro_batch * layout.dp)
        dp_rank = layout.dp_rank(rank)
        pm.train()
        dist.barrier()
        ends = [time.perf_counter()]
        for step in range(args.steps):  # Trainer._train_step
            loss_sum = torch.zeros(())
            for micro in range(accum):
                start = step * cfg.global_batch + (dp_rank * accum + micro) * cfg.micro_batch
                batch = data[start:start + cfg.micro_batch]
                loss_sum += pm.forward_backward(batch[:, :-1], batch[:, 1:], 1.0 / accum, sync=micro == accum - 1)
            pm.clip_grad_norm_(cfg.grad_clip)
            set_lr(opt, lr_at(step, cfg))
            opt.step()
            opt.zero_grad(set_to_none=True)
            ends.append(time.perf_counter())
        gaps = [b - a for a, b in zip(ends, ends[1:])][args.warmup:]
        return statistics.median(gaps)

    times: dict[str, list[float]] = {name: [] for name in LAYOUTS}
    for _ in range(args.repeats):
        for name, (layout, pm, opt) in built.items():
            times[name].append(run(layout, pm, opt))
    if rank == 0:
        described = {name: built[name][0].describe() for name in LAYOUTS}
        print(json.dumps({"times": times, "described": described, "tokens": cfg.global_batch * arch.seq_len,
                          "arch": f"GPT {arch.layers} x {arch.hidden}, {arch.heads} heads, seq {arch.seq_len}",
                          "batch": f"micro_batch {cfg.micro_batch}, global_batch {cfg.global_batch}"}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--project", type=Path, default=ROOT / "examples" / "model7-twin.yaml",
                    help="project file whose first model (architecture, batch) is measured")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--procs", type=int, default=4, help="ranks (a multiple of 2: dp x tp 2)")
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank:
        return rank_main(args)
    port = free_port()
    argv = [sys.executable, __file__, "--rank", "--project", str(args.project), "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--repeats", str(args.repeats)]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=dict(os.environ, RANK=str(r), WORLD_SIZE=str(args.procs), MASTER_PORT=str(port),
                                       OMP_NUM_THREADS="1"))
             for r in range(args.procs)]
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        sys.exit("a rank failed:\n" + "\n".join(out[-2000:] for out in outs))
    result = json.loads([line for line in outs[0].splitlines() if line.startswith('{"times"')][-1])
    tps = {name: result["tokens"] / statistics.median(ts) for name, ts in result["times"].items()}
    print(f"model: {result['arch']} ({args.project.name}), {result['batch']}, {args.procs} gloo ranks x 1 thread, "
          f"steps {args.warmup}..{args.steps}, {args.repeats} round(s)")
    for name, value in tps.items():
        runs = ", ".join(f"{result['tokens'] / t:,.0f}" for t in result["times"][name])
        ratio = "" if name == "ddp" else f"   {name} / ddp = {value / tps['ddp']:.2f}"
        print(f"{name:11s} {result['described'][name]:64s} {value:8,.0f} tokens/s  (runs: {runs}){ratio}")


if __name__ == "__main__":
    main()
