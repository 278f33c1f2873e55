"""Parallelism overhead on CPU ranks: tokens/s of FSDP2 and of pipeline parallelism (pp 2 under each schedule) vs
DDP (the named reference), same model, batch and gloo ranks, measured side by side in one run.

    flock /tmp/ct-heavy.lock .venv/bin/python bench/parallel_overhead.py [--steps 12] [--warmup 3] [--rounds 3] [--procs 4]
    .venv/bin/python bench/parallel_overhead.py --smoke    # 2 ranks, 3 steps, one round, nothing judged

The model and batch are the model-7 twin's (``examples/model7-twin.yaml``: GPT 4 x 160, seq 128, micro_batch
1, global_batch 8); ``--project`` picks another project file's first model. One set of ``--procs`` CPU ranks
(gloo, one thread each) builds every layout through the trainer's ``build_parallel_model`` and optimizer:

  ddp                zero_stage 0 (the reference)
  fsdp               zero_stage 3 with the twin's reshard_after_forward: false (model-7's layout)
  pp2-gpipe          pp 2 x dp (DDP per stage), schedule gpipe
  pp2-1f1b           pp 2 x dp, schedule 1f1b
  pp2v2-interleaved  pp 2 x dp, virtual_stages 2, schedule interleaved_1f1b (needs layers divisible by 4)

and trains each with the body of ``Trainer._train_step`` (``ParallelModel.forward_backward_step`` over the step's
micro-batches, grad-norm clip, schedule, AdamW) on random tokens. The pipelined rows run the model with untied
embeddings (the built-in trainer cannot tie them across stages); when the project's model ties them, a
``ddp-untied`` row is their reference instead of ``ddp``. A row whose layout cannot run the batch (a schedule's
micro-batch rule, a split the layers refuse) is printed with the reason and skipped. The layouts run interleaved in
rounds (bench/harness.py: ddp, fsdp, ..., then the reverse order, ...); a layout's figure in a round is its median
step time after ``--warmup`` steps, measured on rank 0 between step ends, and each RESULT is the per-round ratio of
its tokens/s to its DDP reference's (no target: ``measured``).

What this bench no longer measures (issue 40, item 7):

- **Tensor and sequence parallelism are GPU-only figures.** On 4 gloo ranks sharing 2 cores their extra collectives
  (two all-reduces per block and micro-batch, or two all-gathers and two reduce-scatters with sequence parallelism)
  are TCP round-trips between processes that time-share the cores, nothing like NVLink between GPUs: a ratio here
  says nothing about a GPU run. Their correctness is tested on CPU (tests/integration, the twin's 2-D variant); their
  throughput needs several GPUs in one node. The GPU check (``scripts/gpu-check.sh``, docs/gpu.md) runs on one GPU
  and measures the single-GPU step (``bench/mfu.py``: MFU, trainer ÷ bare loop); TP/SP throughput waits for a
  multi-GPU machine.
- **The pipeline bubble is not measured.** It was ``t_step / (m x t_busy) - 1`` with ``t_busy`` one micro-batch's
  forward and backward through a rank's stages run alone. With more ranks than cores, a rank waiting in the
  pipeline's fill or drain gives its core to a busy rank, so the idle time the bubble is made of is partly spent
  speeding the other stages up, and ``t_busy`` (measured with every rank busy) is not the compute of a step's
  micro-batch: two runs gave -0.80 and 10.3 for the same row, a negative bubble included. A stable measurement needs
  stage compute that does not share cores (a core per rank, or GPUs); stage work replaced by sleeps would be stable
  but would time torch's schedule over sleeps, not this model, and the formula ``(pp - 1) / (v x m)``
  (``clustertrain.plan.memory.pipeline_bubble``) is the schedules' definition (GPipe, Huang et al. 2019; 1F1B and
  interleaving, Narayanan et al. 2021), not a quantity a 2-core machine can check. The pipelined rows' tokens/s
  ratios to DDP remain, as measured figures for this model on this machine.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Bench, Ratio, interleave  # noqa: E402  (puts the repository on sys.path)

from clustertrain.launch.local_ranks import free_port  # noqa: E402

LAYOUTS = {
    "ddp": {"zero_stage": 0},
    "fsdp": {"zero_stage": 3, "reshard_after_forward": False},
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
    """One rank: build every layout, then time them in interleaved rounds; rank 0 prints the step times."""
    import torch
    import torch.distributed as dist

    from clustertrain.resolve import load_project
    from clustertrain.train.config import ParallelismConfig, builtin_problems, microbatch_problems
    from clustertrain.core.parallel_layout import resolve_layout
    from clustertrain.train.model import padded_vocab
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

    def run(layout, pm, opt, accum) -> float:
        """The median step time after the warmup (Trainer._train_step's body)."""
        dp_rank = layout.dp_rank(rank)
        pm.train()
        dist.barrier()
        ends = [time.perf_counter()]
        for step in range(args.steps):
            pm.forward_backward_step(list(batches(step, dp_rank, accum)), 1.0 / accum)
            pm.clip_grad_norm_(cfg.grad_clip)
            set_lr(opt, lr_at(step, cfg))
            opt.step()
            opt.zero_grad(set_to_none=True)
            ends.append(time.perf_counter())
        return statistics.median([b - a for a, b in zip(ends, ends[1:])][args.warmup:])

    # every rank runs the same sides in the same order (interleave's order is deterministic)
    times = interleave({name: (lambda parts=parts: run(*parts)) for name, parts in built.items()}, rounds=args.rounds)
    if rank == 0:
        described = {name: built[name][0].describe() for name in built}
        print(json.dumps({"times": times, "described": described, "skipped": skipped,
                          "tokens": cfg.global_batch * arch.seq_len, "tied": arch.tie_embeddings,
                          "arch": f"GPT {arch.layers} x {arch.hidden}, {arch.heads} heads, seq {arch.seq_len}",
                          "batch": f"micro_batch {cfg.micro_batch}, global_batch {cfg.global_batch}"}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    if "--rank" in sys.argv:
        ap = argparse.ArgumentParser()
        for flag in ("--steps", "--warmup", "--rounds"):
            ap.add_argument(flag, type=int, required=True)
        ap.add_argument("--project", type=Path, required=True)
        ap.add_argument("--rank", action="store_true")
        return rank_main(ap.parse_args()) or 0
    bench = Bench("parallel_overhead", __doc__, rounds=3)
    bench.parser.add_argument("--project", type=Path, default=ROOT / "examples" / "model7-twin.yaml",
                              help="project file whose first model (architecture, batch) is measured")
    bench.parser.add_argument("--steps", type=int, default=12)
    bench.parser.add_argument("--warmup", type=int, default=3)
    bench.parser.add_argument("--procs", type=int, default=4, help="ranks (a multiple of 2: pp 2 x dp)")
    args = bench.parse()
    steps, warmup, procs = (3, 1, 2) if bench.smoke else (args.steps, args.warmup, args.procs)
    if steps <= warmup:
        print(f"bench/parallel_overhead.py: --steps {steps} must exceed --warmup {warmup}: the figures are the steps "
              "after the warmup", file=sys.stderr)
        return 2
    if procs < 2 or procs % 2:
        print(f"bench/parallel_overhead.py: --procs {procs}: give a multiple of 2 (pp 2 x dp)", file=sys.stderr)
        return 2
    port = free_port()
    argv = [sys.executable, __file__, "--rank", "--project", str(args.project), "--steps", str(steps),
            "--warmup", str(warmup), "--rounds", str(args.rounds)]
    procs_ = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=dict(os.environ, RANK=str(r), WORLD_SIZE=str(procs), MASTER_PORT=str(port),
                                        OMP_NUM_THREADS="1"))
              for r in range(procs)]
    outs = [p.communicate()[0] for p in procs_]
    if any(p.returncode for p in procs_):
        print("bench/parallel_overhead.py: a rank failed:\n" + "\n".join(out[-2000:] for out in outs), file=sys.stderr)
        return 1
    result = json.loads([line for line in outs[0].splitlines() if line.startswith('{"times"')][-1])
    times, tokens = result["times"], result["tokens"]
    print(f"model: {result['arch']} ({args.project.name}), {result['batch']}, {procs} gloo ranks x 1 thread, "
          f"steps {warmup}..{steps}")
    for name, ts in times.items():
        print(f"{name:17s} {result['described'][name]:30s} tokens/s per round: "
              + ", ".join(f"{tokens / t:,.0f}" for t in ts))
    for name, why in result["skipped"].items():
        print(f"{name:17s} skipped: {why}")
    for name, ts in times.items():
        ref = UNTIED_REFERENCE if result["tied"] and name in PIPELINED else "ddp"
        if name in ("ddp", UNTIED_REFERENCE) or ref not in times:
            continue
        # tokens/s ratio = reference step time / this layout's step time, per round
        bench.report(Ratio.of(f"parallel_overhead {name} / {ref} tokens/s", times[ref], ts))
    return bench.finish()


if __name__ == "__main__":
    sys.exit(main())
