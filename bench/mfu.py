"""MFU of the trainer's step loop vs a bare torch.compile + fused-AdamW loop, one GPU, side by side.

    .venv/bin/python bench/mfu.py [--steps 30] [--warmup 10] [--micro-batch 8] [--rounds 1] [--dir DIR] [--figures F]
    .venv/bin/python bench/mfu.py --smoke      # a 2 x 64 GPT, 2 steps, one round, nothing judged (CPU or GPU)

Needs a CUDA GPU (on a machine without one it says so in one line and exits 2; ``--device cpu`` with a tiny
``--layers/--hidden/--seq-len`` only checks that the script runs, with no MFU and no memory figures, and its
trainer ÷ bare ratio is printed as ``measured``). ``--smoke`` (bench/harness.py; the test suite runs it) takes the
GPU when there is one and the CPU otherwise, with a tiny model: the same code path — data path, both sides,
compilation, the planner's estimate, the async save — in seconds (torch.compile's first CPU compile needs g++ and
takes most of them). ``scripts/gpu-check.sh`` runs it with ``--steps 20 --warmup 8 --figures mfu.json``. The model is a 1.3B GPT
(24 x 2048, 16 heads, seq 2048, vocab 32000, GELU, tied embeddings; ``--layers/--hidden/...`` change it)
in bf16 compute over fp32 master weights, on random tokens written as an MMIDIDX dataset and read on both sides
through the trainer's data path (``clustertrain.train.feed.BatchFeed`` over ``GPTSamples``: memory-mapped, pinned,
prefetched one micro-batch ahead on a copy stream).

trainer  ``clustertrain.train.parallel.build_parallel_model`` with the layout a one-GPU ``clustertrain run``
         resolves (``parallelism: {compile: true}``, param_dtype bf16 on GPU; one rank runs no process group,
         so neither DDP nor FSDP wraps the model: bf16 autocast, each block compiled), the trainer's
         optimizer (``build_optimizer``: AdamW, fused, decay on matrices only) and the trainer's own step,
         ``clustertrain.train.step.train_step``: ``forward_backward_step``, the grad-norm clip, the device-side
         non-finite check (``NonFiniteSkip.record``), ``set_lr(lr_at(step))``, ``step``, ``zero_grad``.
bare     the same ``GPT`` module (``clustertrain.train.model``), ``torch.compile`` of the whole model, bf16
         autocast, ``torch.optim.AdamW(fused=True)``, ``clip_grad_norm_(foreach=True)``: what one would write
         by hand for one GPU.

Each side: build, ``--warmup`` steps (compilation happens there), then ``--steps`` timed steps between two
``cuda.synchronize``; between sides the compiled graphs are dropped (``torch._dynamo.reset``) and memory freed; tokens/s -> MFU = flops_per_token x tokens/s / peak, with the trainer's FLOPs formula
(``clustertrain.train.model.flops_per_token``) and the GPU's dense bf16 peak from the instance catalog
(``clustertrain.train.metrics.peak_flops_for``). Sides run interleaved (bench/harness.py: trainer, bare; bare,
trainer; ... with ``--rounds``, ``--repeats`` its old name; the first round runs the trainer first, on an empty GPU).
Targets (RESULT lines, on a GPU): trainer / bare tokens/s >= 0.97 per round; trainer MFU >= 45% on an H100/H200.

Also, on the trainer side: peak allocated / reserved memory of the timed steps next to the planner's
prediction for the same layout (``clustertrain.plan.memory.estimate_memory``, flash attention; its total has
no framework allowance, like ``max_memory_allocated``; target within +-15%); and one asynchronous checkpoint
save through ``CheckpointManager`` (the trainer's: DCP, staged to pinned CPU memory): how long the save call
blocks the loop vs one step time (the first save also allocates the staging buffers: printed beside it),
and the step time while the write runs in the background. A 1.3B checkpoint is ~21 GB (fp32 weights and
AdamW moments): ``--dir`` needs that much free disk (default: a temp directory under the current one).
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VOCAB = 32000


def need_cuda(device: str) -> None:
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        print("bench/mfu.py needs a CUDA GPU (torch.cuda.is_available() is False here); run it on a GPU machine "
              "with the CUDA build of torch", file=sys.stderr)
        raise SystemExit(2)


def dataset(args, where: Path) -> str:
    """An MMIDIDX dataset of random tokens under ``where`` (the format ``data prepare`` writes), big enough for the
    run's steps: both sides read it through the trainer's data path."""
    import numpy as np

    from clustertrain.data.indexed import IndexedWriter

    prefix = where / "bench-tokens"
    need = (args.steps + args.warmup + 8) * args.micro_batch * (args.seq_len + 1) * 2
    rng = np.random.default_rng(0)
    writer = IndexedWriter(prefix, np.uint16)
    for _ in range(need // 4096 + 1):
        writer.add_document(rng.integers(0, VOCAB, 4096, dtype=np.uint16))
    writer.finalize()
    return str(prefix)


def feed(args, device, prefix: str):
    """The trainer's data path (:class:`clustertrain.train.feed.BatchFeed` over ``GPTSamples``): a memory-mapped
    read, pinned, sent to the device on a copy stream one micro-batch ahead."""
    import torch

    from clustertrain.data import GPTSamples
    from clustertrain.train.feed import BatchFeed

    samples = GPTSamples(prefix, args.seq_len, seed=1, vocab_size=VOCAB)
    return BatchFeed(samples, global_batch=args.micro_batch, micro_batch=args.micro_batch, dp_rank=0, accum=1,
                     device=torch.device(device))


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(step_fn, steps: int, warmup: int, device) -> tuple[float, list[float]]:
    """Seconds per step over the timed steps (after ``warmup``), and each warm-up step's seconds."""
    warm = []
    for i in range(warmup):
        t0 = time.perf_counter()
        step_fn(i)
        sync(device)
        warm.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    for i in range(warmup, steps):
        step_fn(i)
    sync(device)
    return (time.perf_counter() - t0) / (steps - warmup), warm


def free(device) -> None:
    """Forget the previous side's compiled graphs (they hold its model) and memory; reset the peak."""
    import torch

    torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def run_bare(arch, args, device, prefix: str) -> dict:
    import torch

    from clustertrain.train.model import GPT, loss_fn

    free(device)
    with torch.device(device):
        model = GPT(arch, VOCAB, seed=1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    compiled = torch.compile(model)
    data = feed(args, device, prefix)

    def step(i):
        x, y = data.get(i, 0)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = loss_fn(compiled(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)

    sec, warm = timed(step, args.steps + args.warmup, args.warmup, device)
    out = {"step_s": sec, "compile_s": sum(warm)}
    del model, opt, compiled
    return out


def trainer_parts(arch, args, device):
    from clustertrain.train.config import ParallelismConfig, TrainingConfig
    from clustertrain.core.parallel_layout import resolve_layout
    from clustertrain.train.optim import build_optimizer
    from clustertrain.train.parallel import build_parallel_model
    from clustertrain.train.parallel.compile import check_compiler

    layout = resolve_layout(ParallelismConfig(compile=True, param_dtype="bf16"), world=1, on_gpu=device.type == "cuda")
    check_compiler(device)  # as the trainer does: no compiler is one line, not a traceback mid-step
    cfg = TrainingConfig(max_steps=args.steps + args.warmup, micro_batch=args.micro_batch, global_batch=args.micro_batch,
                         lr=3e-4, min_lr=3e-5, warmup_steps=5)
    pm = build_parallel_model(arch, VOCAB, layout, device, seed=1)
    return layout, cfg, pm, build_optimizer(pm.model, cfg)


def run_trainer(arch, args, device, prefix: str, ckpt_dir: Path | None = None) -> dict:
    import torch

    from clustertrain.train.optim import NonFiniteSkip
    from clustertrain.train.step import StepParts, train_step

    free(device)
    layout, cfg, pm, opt = trainer_parts(arch, args, device)
    parts = StepParts(pm, opt, NonFiniteSkip(device), cfg)
    data = feed(args, device, prefix)

    def step(i):  # the trainer's step (accumulation 1) on the trainer's data path
        train_step(parts, i, data.step_batches(i), 1.0)

    pm.train()
    free(device)
    sec, warm = timed(step, args.steps + args.warmup, args.warmup, device)
    out = {"step_s": sec, "compile_s": sum(warm), "layout": layout}
    if device.type == "cuda":
        out |= {"allocated": torch.cuda.max_memory_allocated(device), "reserved": torch.cuda.max_memory_reserved(device)}
    if ckpt_dir is not None:
        out |= checkpoint_stall(parts, layout, step, sec, ckpt_dir, device)
    del pm, opt
    return out


def checkpoint_stall(parts, layout, step, step_s: float, ckpt_dir: Path, device) -> dict:
    """Async saves as the trainer makes them (``Trainer.__init__``: the writer process started ahead, overlapped
    staging finished before the next optimizer step); the first allocates and pins the staging buffers, the later
    ones are the steady state. The stall of a save is its call plus what the three steps after it took beyond three
    normal steps (``step_s``): the overlapped copy must end before the next optimizer step."""
    from clustertrain.train.checkpoint import CheckpointManager
    from clustertrain.train.checkpoint_state import TrainState, app_state

    mgr = CheckpointManager(ckpt_dir, keep_last=1000, fingerprint="bench", project="bench", model_name="m", rank=0,
                            world_size=1, layout=layout.to_dict(), overlap_staging=True)
    mgr.prepare_async()
    parts.before_optimizer = mgr.staged
    stalls, during, write_s = [], [], []
    try:
        for n in (1, 2, 3):
            sync(device)
            t0 = time.perf_counter()
            mgr.save(n, 0, app_state(parts.pm.model, parts.optimizer, TrainState(n, 0)), async_save=True)
            call = time.perf_counter() - t0
            t1 = time.perf_counter()
            for i in range(3):  # steps while the write runs in the writer process
                step(i)
            sync(device)
            during.append((time.perf_counter() - t1) / 3)
            stalls.append(call + max(0.0, 3 * (during[-1] - step_s)))
            mgr.wait()
            write_s.append(time.perf_counter() - t0)
            for old in ckpt_dir.glob("step_*"):
                shutil.rmtree(old)
    finally:
        mgr.close()
        parts.before_optimizer = None
    return {"stall_first_s": stalls[0], "stall_s": min(stalls[1:]), "step_during_write_s": during[-1],
            "save_s": write_s[-1]}


def progress(line: str) -> None:
    """A line on stderr as each side finishes: a run cut short (a GPU lent for minutes) still leaves figures."""
    print(f"[mfu] {line}", file=sys.stderr, flush=True)


def figures_argv(argv: list[str]) -> list[str]:
    """``--json FILE`` (scripts/gpu-check.sh) is ``--figures FILE``; a bare ``--json`` stays the harness's flag (each
    RESULT also as a JSON line)."""
    out = list(argv)
    for i, arg in enumerate(out[:-1]):
        if arg == "--json" and not out[i + 1].startswith("-"):
            out[i] = "--figures"
    return out


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from harness import Bench, Ratio, interleave

    bench = Bench("mfu", __doc__, rounds=1)
    ap = bench.parser
    ap.add_argument("--figures", type=Path, default=None,
                    help="also write the figures to this JSON file (scripts/gpu-check.sh: --json FILE, the old spelling)")
    ap.add_argument("--repeats", type=int, dest="rounds", default=argparse.SUPPRESS, help="the old name of --rounds")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--dir", type=Path, default=None, help="where the checkpoint goes (default: a temp dir under .)")
    ap.add_argument("--no-checkpoint", action="store_true", help="skip the async-save stall")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: only checks that the script runs (use tiny sizes; no MFU or memory figures)")
    args = bench.parse(figures_argv(sys.argv[1:]))
    if bench.smoke:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
        args.layers, args.hidden, args.heads, args.seq_len, args.micro_batch = 2, 64, 4, 32, 2
        args.steps, args.warmup = 2, 1
    need_cuda(args.device)
    warnings.filterwarnings("ignore")  # DCP warns that it runs without a process group
    import torch

    from clustertrain.plan.memory import GiB, estimate_memory
    from clustertrain.core.model_shape import ModelShape
    from clustertrain.train.config import ArchConfig
    from clustertrain.train.metrics import peak_flops_for
    from clustertrain.train.model import GPT, flops_per_token

    if args.device == "cuda":
        device = torch.device("cuda", 0)
        torch.cuda.set_device(device)
        name = torch.cuda.get_device_name(device)
        peak = peak_flops_for(name)
    else:
        device, name, peak = torch.device("cpu"), "CPU (a smoke test of this script: no MFU)", None
    on_gpu = device.type == "cuda"
    arch = ArchConfig(layers=args.layers, hidden=args.hidden, heads=args.heads, seq_len=args.seq_len, vocab=VOCAB, mlp="gelu")
    with torch.device("meta"):
        meta = GPT(arch, VOCAB)
    params, fpt = meta.num_params(), flops_per_token(arch, meta.num_params(non_embedding=True))
    tokens = args.micro_batch * args.seq_len

    base = Path(tempfile.mkdtemp(prefix=".bench-mfu-", dir=args.dir or Path.cwd()))
    bare, ours = [], []
    try:
        prefix = dataset(args, base)

        def trainer_side() -> float:
            last = len(ours) == args.rounds - 1 and not args.no_checkpoint
            ours.append(run_trainer(arch, args, device, prefix, base / "ckpt" if last else None))
            progress(f"round {len(ours)}: trainer {ours[-1]['step_s'] * 1e3:.1f} ms/step "
                     f"(warm-up {ours[-1]['compile_s']:.0f} s)")
            return ours[-1]["step_s"]

        def bare_side() -> float:
            bare.append(run_bare(arch, args, device, prefix))
            progress(f"round {len(bare)}: bare {bare[-1]['step_s'] * 1e3:.1f} ms/step (warm-up {bare[-1]['compile_s']:.0f} s)")
            return bare[-1]["step_s"]

        # the trainer first in round 1: its memory (ours[0]) is measured on an empty GPU
        step_s = interleave({"trainer": trainer_side, "bare": bare_side}, rounds=args.rounds)
    finally:
        shutil.rmtree(base, ignore_errors=True)

    med = lambda rows, key: statistics.median(x[key] for x in rows)  # noqa: E731
    b, t = med(bare, "step_s"), med(ours, "step_s")
    mfu = lambda sec: f"{fpt * tokens / sec / peak:6.1%}" if peak else "   n/a"  # noqa: E731
    layout = ours[-1]["layout"]
    print(f"GPU: {name}, dense bf16 peak {peak / 1e12:.0f} TFLOP/s" if peak else f"GPU: {name} (no bf16 peak in the catalog: MFU n/a)")
    print(f"model: GPT {args.layers} x {args.hidden}, {args.heads} heads, seq {args.seq_len}, vocab {VOCAB}: {params / 1e9:.2f}B "
          f"parameters, {fpt / 1e9:.2f} GFLOP/token; micro_batch {args.micro_batch} ({tokens:,} tokens/step), "
          f"{args.steps} timed steps after {args.warmup}, {args.rounds} round(s)")
    print(f"bare (torch.compile + fused AdamW) : {b * 1e3:8.1f} ms/step {tokens / b:10,.0f} tokens/s  MFU {mfu(b)}  "
          f"(warm-up incl. compile {med(bare, 'compile_s'):.0f} s)")
    print(f"trainer ({layout.describe()}) : {t * 1e3:8.1f} ms/step {tokens / t:10,.0f} tokens/s  MFU {mfu(t)}  "
          f"(warm-up incl. compile {med(ours, 'compile_s'):.0f} s)")
    # trainer tokens/s / bare tokens/s = bare step time / trainer step time, per round; judged on a GPU only
    bench.report(Ratio.of("mfu trainer / bare tokens/s", step_s["bare"], step_s["trainer"],
                          at_least=0.97 if on_gpu else None))
    if peak:
        bench.report(Ratio("mfu trainer MFU", [fpt * tokens / x / peak for x in step_s["trainer"]], at_least=0.45,
                           unit="", note=name))
    est = estimate_memory(ModelShape.from_arch(arch, VOCAB), layout, micro_batch=args.micro_batch, flash_attention=True)
    planned = (f"planner {est.total_bytes / GiB:.2f} GiB (states {est.model_states_bytes / GiB:.2f}, activations "
               f"{est.activations_bytes / GiB:.2f}, buffers {est.buffers_bytes / GiB:.2f})")
    if "allocated" in ours[0]:
        alloc, reserved = ours[0]["allocated"], ours[0]["reserved"]
        print(f"memory (trainer): peak allocated {alloc / GiB:.1f} GiB, reserved {reserved / GiB:.1f} GiB; {planned}")
        bench.report(Ratio("mfu peak allocated / planner memory", [alloc / est.total_bytes], at_least=0.85,
                           at_most=1.15))
    else:
        print(f"memory: {planned}; no GPU, nothing measured")
    if not args.no_checkpoint:
        c = ours[-1]
        print(f"async checkpoint: save call blocks {c['stall_s']:.2f} s (first save, allocating staging: "
              f"{c['stall_first_s']:.2f} s), whole save {c['save_s']:.1f} s; step {t:.3f} s, "
              f"{c['step_during_write_s']:.3f} s while writing")
        bench.report(Ratio("mfu async-save stall / step time", [c["stall_s"] / ours[-1]["step_s"]],
                           at_most=1.0 if on_gpu else None))
    if args.figures is not None:
        figures = {"device": name, "params": params, "micro_batch": args.micro_batch, "seq_len": args.seq_len,
                   "steps": args.steps, "bare_step_s": b, "trainer_step_s": t, "trainer_over_bare": b / t,
                   "trainer_mfu": fpt * tokens / t / peak if peak else None,
                   "bare_mfu": fpt * tokens / b / peak if peak else None, "planned_bytes": est.total_bytes,
                   "allocated_bytes": ours[0].get("allocated"), "reserved_bytes": ours[0].get("reserved")}
        if not args.no_checkpoint:
            figures |= {k: ours[-1][k] for k in ("stall_s", "stall_first_s", "save_s", "step_during_write_s")}
        args.figures.write_text(json.dumps(figures, indent=1) + "\n")
    return bench.finish()


if __name__ == "__main__":
    from clustertrain.core.errors import ClusterTrainError

    try:
        sys.exit(main())
    except ClusterTrainError as e:  # e.g. no working compiler: one line, as the trainer says it
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
