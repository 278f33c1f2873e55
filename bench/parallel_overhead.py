"""Parallelism overhead: tokens/s of FSDP2, of dp 2 x tp 2 and of pipeline parallelism (pp 2 under each schedule)
vs DDP, same model, batch and gloo ranks, measured side by side in one run; for the pipelined rows, the measured
pipeline bubble next to the planner's prediction.

    .venv/bin/python bench/parallel_overhead.py [--steps 12] [--warmup 3] [--repeats 2] [--procs 4]

The model and batch are the model-7 twin's (``examples/model7-twin.yaml``: GPT 4 x 160, seq 128, micro_batch
1, global_batch 8); ``--project`` picks another project file's first model. One set of ``--procs`` CPU ranks
(gloo, one thread each) builds every layout through the trainer's ``build_parallel_model`` and optimizer:

  ddp                zero_stage 0 (the reference)
  fsdp               zero_stage 3 with the twin's reshard_after_forward: false (model-7's layout)
  dp2xtp2            zero_stage 3, tp 2
  dp2xtp2-sp         zero_stage 3, tp 2, sequence_parallel, recompute selective (the twin's 2-D variant)
  pp2-gpipe          pp 2 x dp (DDP per stage), schedule gpipe
  pp2-1f1b           pp 2 x dp, schedule 1f1b
  pp2v2-interleaved  pp 2 x dp, virtual_stages 2, schedule interleaved_1f1b (needs layers divisible by 4)

and trains each in turn with the body of ``Trainer._train_step`` (``ParallelModel.forward_backward_step`` over the
step's micro-batches, grad-norm clip, schedule, AdamW) on random tokens. The pipelined rows run the model with
untied embeddings (the built-in trainer cannot tie them across stages); when the project's model ties them, a
``ddp-untied`` row is their reference instead of ``ddp``. A row whose layout cannot run the batch (a schedule's
micro-batch rule, a split the layers refuse) is printed with the reason and skipped. Rounds alternate over the
layouts (ddp, fsdp, ..., ddp, ...); each layout's figure is the median over rounds of its median step time after
``--warmup`` steps, measured on rank 0 between step ends. Printed: tokens/s per layout and its ratio to its
DDP reference.

Bubble, for the pipelined rows (m = micro-batches per step = global_batch / (micro_batch x dp)):

- predicted: ``clustertrain.plan.memory.pipeline_bubble(pp, v, m)`` = (pp - 1) / (v x m) (gpipe and 1f1b:
  v = 1), what the planner adds to a step's compute time;
- measured, in the same terms (idle time over useful compute): ``t_step / (m x t_busy) - 1``, where ``t_step`` is
  the median over steps of ``forward_backward_step``'s time (the slowest rank's, per step), and ``t_busy`` the
  time one micro-batch's forward and backward take through the rank's stages run alone, without the schedule
  (each stage module called directly: token ids or random hidden states in, the loss or a random output
  gradient back; DDP's reduction off), on every rank at once as in the pipeline's steady state, the median of
  ``--steps`` such runs after ``--warmup``, the largest over the ranks (the slowest stage sets the pace), taken
  right after the row's timed steps in each round (the same load on the machine); both are medians over rounds.
  What ``t_step`` has that ``m x t_busy`` has not counts as bubble: the fill and drain, the stage-to-stage sends
  and receives, the schedule's own work and DDP's gradient all-reduce at the last micro-batch.

No target: on CPU ranks the extra collectives of FSDP (a gather per block and micro-batch, a reduce-scatter per
block), of tensor parallelism (two all-reduces, or with sequence parallelism two all-gathers and two
reduce-scatters, per block and micro-batch) and the pipeline's point-to-point sends cost latency that a tiny model
cannot hide, and with more ranks than cores the ranks of a pipeline's steady state share the cores (so do the
``t_busy`` runs, which is why they run on every rank at once); the figures say how much, for this model on this
machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from contextlib import nullcontext
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
UNTIED_REFERENCE = "ddp-untied"  # the pipelined rows' reference when the project's model ties its embeddings
PIPELINED = {
    "pp2-gpipe": {"zero_stage": 0, "pp": 2, "schedule": "gpipe"},
    "pp2-1f1b": {"zero_stage": 0, "pp": 2, "schedule": "1f1b"},
    "pp2v2-interleaved": {"zero_stage": 0, "pp": 2, "virtual_stages": 2, "schedule": "interleaved_1f1b"},
}


def rows(tied: bool) -> dict[str, tuple[dict, bool]]:
    """Every row: name -> (parallelism fields, untied model)."""
    out = {name: (fields, False) for name, fields in LAYOUTS.items()}
    if tied:
        out[UNTIED_REFERENCE] = ({"zero_stage": 0}, True)
    out.update({name: (fields, True) for name, fields in PIPELINED.items()})
    return out


def rank_main(args: argparse.Namespace) -> None:
    """One rank: build every layout, then time them in alternating rounds; rank 0 prints the step times."""
    import torch
    import torch.distributed as dist

    from clustertrain.resolve import load_project
    from clustertrain.train.config import ParallelismConfig, builtin_problems, microbatch_problems
    from clustertrain.core.parallel_layout import resolve_layout
    from clustertrain.train.model import loss_fn, padded_vocab
    from clustertrain.train.optim import build_optimizer, lr_at, set_lr
    from clustertrain.train.parallel import build_parallel_model

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}", rank=rank, world_size=world)
    entry = load_project(args.project).models[0]
    arch, cfg = entry.model, entry.training.model_copy(update={"max_steps": args.steps})
    untied = arch.model_copy(update={"tie_embeddings": False})
    vocab = padded_vocab(arch, 258)  # the byte tokenizer's vocabulary, as the twin's run pads it
    built, skipped = {}, {}
    for name, (fields, use_untied) in rows(arch.tie_embeddings).items():
        par = ParallelismConfig(**fields)
        model_arch = untied if use_untied else arch
        layout = resolve_layout(par, world, on_gpu=False)
        accum = cfg.global_batch // (cfg.micro_batch * layout.dp)
        problems = builtin_problems(par, model_arch) + microbatch_problems(par, accum)
        if problems:
            skipped[name] = f"{problems[0][0]}: {problems[0][1]}"
            continue
        pm = build_parallel_model(model_arch, vocab, layout, torch.device("cpu"), seed=cfg.seed, microbatches=accum)
        built[name] = (layout, pm, build_optimizer(pm.model, cfg), accum)
    gen = torch.Generator().manual_seed(0)
    data = torch.randint(0, vocab, (args.steps * cfg.global_batch, arch.seq_len + 1), generator=gen)

    def batches(step: int, dp_rank: int, accum: int):
        for micro in range(accum):
            start = step * cfg.global_batch + (dp_rank * accum + micro) * cfg.micro_batch
            batch = data[start:start + cfg.micro_batch]
            yield batch[:, :-1], batch[:, 1:]

    def run(layout, pm, opt, accum) -> tuple[float, float]:
        """(median step time, median forward_backward_step time of the slowest rank) after the warmup."""
        dp_rank = layout.dp_rank(rank)
        pm.train()
        dist.barrier()
        ends, fb = [time.perf_counter()], []
        for step in range(args.steps):  # Trainer._train_step
            started = time.perf_counter()
            pm.forward_backward_step(list(batches(step, dp_rank, accum)), 1.0 / accum)
            fb.append(time.perf_counter() - started)
            pm.clip_grad_norm_(cfg.grad_clip)
            set_lr(opt, lr_at(step, cfg))
            opt.step()
            opt.zero_grad(set_to_none=True)
            ends.append(time.perf_counter())
        slowest = torch.tensor(fb, dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        gaps = [b - a for a, b in zip(ends, ends[1:])][args.warmup:]
        return statistics.median(gaps), statistics.median(slowest.tolist()[args.warmup:])

    def busy(layout, pm) -> float:
        """One micro-batch's forward and backward through this rank's stages alone (the slowest rank's median)."""
        pipe = pm.pipeline
        x, y = next(batches(0, layout.dp_rank(rank), 1))
        shape = (cfg.micro_batch, arch.seq_len, arch.hidden)
        times = []
        dist.barrier()
        for _ in range(args.steps):
            started = time.perf_counter()
            for stage in pipe.stages:
                module = stage.submod
                with module.no_sync() if hasattr(module, "no_sync") else nullcontext():  # DDP: no reduction
                    inp = x if stage.is_first else torch.randn(shape, requires_grad=True)
                    out = module(inp)
                    if stage.is_last:
                        loss_fn(out, y).backward()
                    else:
                        out.backward(torch.randn_like(out))
            times.append(time.perf_counter() - started)
        pm.model.zero_grad(set_to_none=True)
        slowest = torch.tensor([statistics.median(times[args.warmup:] or times)], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        return float(slowest)

    times: dict[str, list[float]] = {name: [] for name in built}
    fb_times: dict[str, list[float]] = {name: [] for name in built}
    busy_times: dict[str, list[float]] = {name: [] for name, (layout, *_) in built.items() if layout.pp > 1}
    for _ in range(args.repeats):
        for name, (layout, pm, opt, accum) in built.items():
            step, fb = run(layout, pm, opt, accum)
            times[name].append(step)
            fb_times[name].append(fb)
            if layout.pp > 1:  # right after its timed steps: the same load on the machine
                busy_times[name].append(busy(layout, pm))
    if rank == 0:
        described = {name: built[name][0].describe() for name in built}
        pipes = {name: {"pp": built[name][0].pp, "v": built[name][0].virtual_stages, "m": built[name][3],
                        "fb": statistics.median(fb_times[name]), "busy": statistics.median(busy_times[name])} for name in busy_times}
        print(json.dumps({"times": times, "described": described, "skipped": skipped, "pipes": pipes,
                          "tokens": cfg.global_batch * arch.seq_len, "tied": arch.tie_embeddings,
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
    ap.add_argument("--procs", type=int, default=4, help="ranks (a multiple of 2: dp x tp 2, pp 2 x dp)")
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank:
        return rank_main(args)
    if args.steps <= args.warmup:
        sys.exit(f"--steps {args.steps} must exceed --warmup {args.warmup}: the figures are the steps after the warmup")
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
    width = max(len(text) for text in result["described"].values())
    for name, value in tps.items():
        runs = ", ".join(f"{result['tokens'] / t:,.0f}" for t in result["times"][name])
        ref = UNTIED_REFERENCE if result["tied"] and name in PIPELINED else "ddp"
        ratio = "" if name in ("ddp", UNTIED_REFERENCE) or ref not in tps else f"   {name} / {ref} = {value / tps[ref]:.2f}"
        print(f"{name:17s} {result['described'][name]:{width}s} {value:8,.0f} tokens/s  (runs: {runs}){ratio}")
    for name, why in result["skipped"].items():
        print(f"{name:17s} skipped: {why}")
    if result["pipes"]:
        from clustertrain.plan.memory import pipeline_bubble

        print("\npipeline bubble (idle time / useful compute): measured = t_step / (m x t_busy) - 1, "
              "predicted = (pp - 1) / (v x m)")
        for name, p in result["pipes"].items():
            measured = p["fb"] / (p["m"] * p["busy"]) - 1
            predicted = pipeline_bubble(p["pp"], p["v"], p["m"])
            print(f"{name:17s} pp {p['pp']} v {p['v']} m {p['m']}: t_step {p['fb'] * 1e3:7.1f} ms, m x t_busy "
                  f"{p['m'] * p['busy'] * 1e3:7.1f} ms, measured {measured:5.2f}, predicted {predicted:5.2f}, "
                  f"measured / predicted = {measured / predicted:.2f}")


if __name__ == "__main__":
    main()
