"""MFU of the trainer's step loop vs a bare torch.compile + fused-AdamW loop, one GPU, side by side.

    .venv/bin/python bench/mfu.py [--steps 30] [--warmup 10] [--micro-batch 8] [--repeats 1] [--dir DIR]

Needs a CUDA GPU (on a machine without one it says so in one line and exits 2; ``--device cpu`` with a tiny
``--layers/--hidden/--seq-len`` only checks that the script runs, with no MFU and no memory figures). The model is a 1.3B GPT
(24 x 2048, 16 heads, seq 2048, vocab 32000, GELU, tied embeddings; ``--layers/--hidden/...`` change it)
in bf16 compute over fp32 master weights, on random tokens (the data loader is not what is measured).

trainer  ``clustertrain.train.parallel.build_parallel_model`` with the layout a one-GPU ``clustertrain run``
         resolves (``parallelism: {compile: true}``, param_dtype bf16 on GPU; one rank runs no process group,
         so neither DDP nor FSDP wraps the model: bf16 autocast, each block compiled), the trainer's
         optimizer (``build_optimizer``: AdamW, fused, decay on matrices only) and the body of
         ``Trainer._train_step``: ``forward_backward``, the grad-norm clip, the device-side non-finite check
         (``NonFiniteSkip.record``), ``set_lr(lr_at(step))``,
         ``step``, ``zero_grad``.
bare     the same ``GPT`` module (``clustertrain.train.model``), ``torch.compile`` of the whole model, bf16
         autocast, ``torch.optim.AdamW(fused=True)``, ``clip_grad_norm_(foreach=True)``: what one would write
         by hand for one GPU.

Each side: build, ``--warmup`` steps (compilation happens there), then ``--steps`` timed steps between two
``cuda.synchronize``; between sides the compiled graphs are dropped (``torch._dynamo.reset``) and memory freed; tokens/s -> MFU = flops_per_token x tokens/s / peak, with the trainer's FLOPs formula
(``clustertrain.train.model.flops_per_token``) and the GPU's dense bf16 peak from the instance catalog
(``clustertrain.train.metrics.peak_flops_for``). Sides alternate (trainer, bare, trainer, ... with ``--repeats``);
medians are printed.
Targets: trainer / bare >= 0.97; trainer MFU >= 45% on an H100/H200.

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


def batches(args, device):
    import torch

    gen = torch.Generator(device=device).manual_seed(0)
    return torch.randint(0, VOCAB, (args.steps + args.warmup, args.micro_batch, args.seq_len + 1), device=device,
                         generator=gen)


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(step_fn, data, warmup: int, device) -> tuple[float, list[float]]:
    """Seconds per step over the timed steps (after ``warmup``), and each warm-up step's seconds."""
    warm = []
    for i in range(warmup):
        t0 = time.perf_counter()
        step_fn(i, data[i])
        sync(device)
        warm.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    for i in range(warmup, len(data)):
        step_fn(i, data[i])
    sync(device)
    return (time.perf_counter() - t0) / (len(data) - warmup), warm


def free(device) -> None:
    """Forget the previous side's compiled graphs (they hold its model) and memory; reset the peak."""
    import torch

    torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def run_bare(arch, args, device) -> dict:
    import torch

    from clustertrain.train.model import GPT, loss_fn

    free(device)
    with torch.device(device):
        model = GPT(arch, VOCAB, seed=1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    compiled = torch.compile(model)

    def step(i, batch):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = loss_fn(compiled(batch[:, :-1]), batch[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)

    sec, warm = timed(step, batches(args, device), args.warmup, device)
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


def run_trainer(arch, args, device, ckpt_dir: Path | None = None) -> dict:
    import torch

    from clustertrain.train.optim import NonFiniteSkip, lr_at, set_lr

    free(device)
    layout, cfg, pm, opt = trainer_parts(arch, args, device)
    nonfinite = NonFiniteSkip(device)

    def step(i, batch):  # Trainer._train_step with accumulation 1
        loss_sum = torch.zeros((), device=device)
        loss_sum += pm.forward_backward(batch[:, :-1], batch[:, 1:], 1.0, sync=True)
        grad_norm = pm.clip_grad_norm_(cfg.grad_clip)
        nonfinite.record(i + 1, grad_norm, opt)  # the trainer's device-side non-finite check (no host sync)
        set_lr(opt, lr_at(i, cfg))
        opt.step()
        opt.zero_grad(set_to_none=True)

    pm.train()
    data = batches(args, device)
    free(device)
    sec, warm = timed(step, data, args.warmup, device)
    out = {"step_s": sec, "compile_s": sum(warm), "layout": layout}
    if device.type == "cuda":
        out |= {"allocated": torch.cuda.max_memory_allocated(device), "reserved": torch.cuda.max_memory_reserved(device)}
    if ckpt_dir is not None:
        out |= checkpoint_stall(pm, opt, layout, step, data, ckpt_dir, device)
    del pm, opt
    return out


def checkpoint_stall(pm, opt, layout, step, data, ckpt_dir: Path, device) -> dict:
    """Two async saves as the trainer makes them; the second is the steady state (staging buffers reused)."""
    from clustertrain.train.checkpoint import CheckpointManager
    from clustertrain.train.checkpoint_state import TrainState, app_state

    mgr = CheckpointManager(ckpt_dir, keep_last=1000, fingerprint="bench", project="bench", model_name="m", rank=0,
                            world_size=1, layout=layout.to_dict())
    stalls, during, write_s = [], [], []
    try:
        for n in (1, 2):
            sync(device)
            t0 = time.perf_counter()
            mgr.save(n, 0, app_state(pm.model, opt, TrainState(n, 0)), async_save=True)
            stalls.append(time.perf_counter() - t0)
            t1 = time.perf_counter()
            for i in range(3):  # steps while the write runs in the background thread
                step(i, data[i])
            sync(device)
            during.append((time.perf_counter() - t1) / 3)
            mgr.wait()
            write_s.append(time.perf_counter() - t0)
            for old in ckpt_dir.glob("step_*"):
                shutil.rmtree(old)
    finally:
        mgr.close()
    return {"stall_first_s": stalls[0], "stall_s": stalls[1], "step_during_write_s": during[1], "save_s": write_s[1]}


def progress(line: str) -> None:
    """A line on stderr as each side finishes: a run cut short (a GPU lent for minutes) still leaves figures."""
    print(f"[mfu] {line}", file=sys.stderr, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--dir", type=Path, default=None, help="where the checkpoint goes (default: a temp dir under .)")
    ap.add_argument("--no-checkpoint", action="store_true", help="skip the async-save stall")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: only checks that the script runs (use tiny sizes; no MFU or memory figures)")
    args = ap.parse_args()
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
    arch = ArchConfig(layers=args.layers, hidden=args.hidden, heads=args.heads, seq_len=args.seq_len, vocab=VOCAB, mlp="gelu")
    with torch.device("meta"):
        meta = GPT(arch, VOCAB)
    params, fpt = meta.num_params(), flops_per_token(arch, meta.num_params(non_embedding=True))
    tokens = args.micro_batch * args.seq_len

    base = Path(tempfile.mkdtemp(prefix=".bench-mfu-", dir=args.dir or Path.cwd()))
    bare, ours = [], []
    try:
        for r in range(args.repeats):  # the trainer first: its memory is measured on an empty GPU
            last = r == args.repeats - 1 and not args.no_checkpoint
            ours.append(run_trainer(arch, args, device, base / "ckpt" if last else None))
            progress(f"round {r + 1}: trainer {ours[-1]['step_s'] * 1e3:.1f} ms/step (warm-up {ours[-1]['compile_s']:.0f} s)")
            bare.append(run_bare(arch, args, device))
            progress(f"round {r + 1}: bare {bare[-1]['step_s'] * 1e3:.1f} ms/step (warm-up {bare[-1]['compile_s']:.0f} s)")
    finally:
        shutil.rmtree(base, ignore_errors=True)

    med = lambda rows, key: statistics.median(x[key] for x in rows)  # noqa: E731
    b, t = med(bare, "step_s"), med(ours, "step_s")
    mfu = lambda sec: f"{fpt * tokens / sec / peak:6.1%}" if peak else "   n/a"  # noqa: E731
    layout = ours[-1]["layout"]
    print(f"GPU: {name}, dense bf16 peak {peak / 1e12:.0f} TFLOP/s" if peak else f"GPU: {name} (no bf16 peak in the catalog: MFU n/a)")
    print(f"model: GPT {args.layers} x {args.hidden}, {args.heads} heads, seq {args.seq_len}, vocab {VOCAB}: {params / 1e9:.2f}B "
          f"parameters, {fpt / 1e9:.2f} GFLOP/token; micro_batch {args.micro_batch} ({tokens:,} tokens/step), "
          f"{args.steps} timed steps after {args.warmup}, {args.repeats} round(s)")
    print(f"bare (torch.compile + fused AdamW) : {b * 1e3:8.1f} ms/step {tokens / b:10,.0f} tokens/s  MFU {mfu(b)}  "
          f"(warm-up incl. compile {med(bare, 'compile_s'):.0f} s)")
    print(f"trainer ({layout.describe()}) : {t * 1e3:8.1f} ms/step {tokens / t:10,.0f} tokens/s  MFU {mfu(t)}  "
          f"(warm-up incl. compile {med(ours, 'compile_s'):.0f} s)")
    print(f"trainer / bare = {b / t:.3f}   (target >= 0.97);  trainer MFU {mfu(t).strip()}   (target >= 45% on H100/H200)")
    est = estimate_memory(ModelShape.from_arch(arch, VOCAB), layout, micro_batch=args.micro_batch, flash_attention=True)
    planned = (f"planner {est.total_bytes / GiB:.2f} GiB (states {est.model_states_bytes / GiB:.2f}, activations "
               f"{est.activations_bytes / GiB:.2f}, buffers {est.buffers_bytes / GiB:.2f})")
    if "allocated" in ours[0]:
        alloc, reserved = ours[0]["allocated"], ours[0]["reserved"]
        print(f"memory (trainer): peak allocated {alloc / GiB:.1f} GiB, reserved {reserved / GiB:.1f} GiB; {planned}; "
              f"allocated / planner = {alloc / est.total_bytes:.2f}   (target 0.85-1.15)")
    else:
        print(f"memory: {planned}; no GPU, nothing measured")
    if not args.no_checkpoint:
        c = ours[-1]
        print(f"async checkpoint: save call blocks {c['stall_s']:.2f} s (first save, allocating staging: "
              f"{c['stall_first_s']:.2f} s), whole save {c['save_s']:.1f} s; step {t:.3f} s, "
              f"{c['step_during_write_s']:.3f} s while writing; stall / step = {c['stall_s'] / t:.2f}   (target < 1)")


if __name__ == "__main__":
    from clustertrain.core.errors import ClusterTrainError

    try:
        main()
    except ClusterTrainError as e:  # e.g. no working compiler: one line, as the trainer says it
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
