"""``calibrate(project)``: measure this machine with torch and predict a CPU project's step time.

CPU workers have no data-sheet peak, so the planner measures one: fp32 matmul throughput with the
worker's thread count at the model's own GEMM shapes (forward, input-gradient and weight-gradient
products of every linear layer and the head). The step-time prediction per rank adds the other
kernels a training step runs, each timed once at the model's shapes:

  step = accum x (L x (GEMMs + attention core [+ rotary] + 2 norms + GELU/SwiGLU + residual adds)
                  + head GEMMs + cross-entropy + embeddings) + AdamW step + gradient clipping
         + DDP all-reduce (gradient bytes x 2 (ring) / measured memory-copy bandwidth, when dp > 1)

(all fp32, forward + backward), at the model's architecture: the q/k/v GEMM is h x (h + 2k) wide (k = kv_heads x
head_dim), attention runs with kv_heads key/value heads (``enable_gqa``), ``position: rope`` adds the rotation of q
and k, linear biases and the learned position table exist only when the model has them (the AdamW and clipping
parts run over the model's own tensor sizes). ``norm_eps`` does not change a norm's time and is not modelled.
``efficiency`` = model FLOPs (the trainer's formula) per predicted
step ÷ matmul throughput: the CPU stand-in for MFU that ``make_plan`` then uses.
This kernel model leaves out the trainer's per-step framework work (autograd bookkeeping, DDP/FSDP2 hooks, gloo
collectives, logging): on 2 CPU ranks it predicted 0.36 of a 4 x 128 model's measured step, 0.94 of a 6 x 384 one's
(DDP) and 0.48-0.73 with FSDP2 (docs/plan.md). A pilot run's own rate (:mod:`clustertrain.plan.pilot`,
``clustertrain plan --calibrate-from RUN_DIR``) is what ``bench/plan_accuracy.py`` holds to 0.8-1.25.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Calibration:
    threads: int
    flops_per_worker: float          # fp32 matmul FLOP/s at the model's GEMM shapes, per worker
    efficiency: float                # model FLOP/s per worker at the predicted step time ÷ flops_per_worker
    predicted_step_s: float          # one optimizer step (all micro-batches) on one rank
    parts_s: dict[str, float] = field(default_factory=dict)
    note: str = ""                   # where the figures come from, when not from this module's measurement
                                     # (clustertrain.plan.pilot: a pilot run's achieved rate)


def _timed(fn, min_time: float = 0.05, trials: int = 5) -> float:
    """Median seconds per call of ``fn`` over ``trials`` batches lasting ``min_time`` each (after warm-up)."""
    fn()
    fn()
    out = []
    for _ in range(trials):
        n, t0 = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            dt = time.perf_counter() - t0
            if dt >= min_time:
                break
        out.append(dt / n)
    return statistics.median(out)


def default_threads(project) -> int:
    """Threads per worker as the local launcher sets them: cluster.threads_per_worker or cores / workers."""
    c = project.cluster
    if c.threads_per_worker:
        return c.threads_per_worker
    return max(1, len(os.sched_getaffinity(0)) // c.ranks_per_node)  # the CPUs this process may use (train/threads.py)


def calibrate(project, model: str | None = None, threads: int | None = None, side_by_side: bool = True) -> Calibration:
    """Measure this machine for ``project``'s (first, or named) model on CPU workers.

    With ``side_by_side`` (default) the measurement runs in as many processes as the project has
    workers per node, started together, so that they share cores, caches and memory bandwidth the
    way the trainer's workers do; the slowest worker sets the predicted step (ranks wait for each
    other at every all-reduce)."""
    from clustertrain.core.model_shape import ModelShape
    from clustertrain.data.tokenizers import model_vocab

    entry = project.model(model) if model else project.models[0]
    shape = ModelShape.from_arch(entry.model, model_vocab(entry.model, entry.data.tokenizer))
    t = entry.training
    dp = project.cluster.world_size
    job = (shape, t.micro_batch, t.global_batch, dp, threads or default_threads(project))
    workers = project.cluster.ranks_per_node if side_by_side else 1
    results = [_measure(*job)] if workers == 1 else _side_by_side(job, workers)
    slowest = max(results, key=lambda r: sum(r[1].values()))
    tput = statistics.mean(r[0] for r in results)
    step = sum(slowest[1].values())
    model_flops = shape.flops_per_token() * t.global_batch * shape.seq_len / dp
    return Calibration(job[4], tput, model_flops / step / tput, step, slowest[1])


def _side_by_side(job, workers: int) -> list[tuple[float, dict[str, float]]]:
    """Run ``_measure`` in ``workers`` fresh interpreters that start measuring together.
    Protocol on each worker's stdin/stdout (one JSON line each): job -> "ready" -> "go" -> result."""
    shape, *rest = job
    line = json.dumps({"shape": dataclasses.asdict(shape), "rest": rest}) + "\n"
    cmd = [sys.executable, "-m", "clustertrain.plan.calibrate"]
    procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(workers)]
    try:
        for p in procs:
            p.stdin.write(line)
            p.stdin.flush()
        for p in procs:
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError("calibration worker failed to start")
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        results = []
        for p in procs:
            tput, parts = json.loads(p.stdout.readline())
            results.append((tput, parts))
        return results
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(timeout=60)


def _worker_main() -> None:
    import torch

    from clustertrain.core.model_shape import ModelShape

    job = json.loads(sys.stdin.readline())
    torch.ones(1)  # initialise before the measurement starts
    print("ready", flush=True)
    sys.stdin.readline()
    print(json.dumps(_measure(ModelShape(**job["shape"]), *job["rest"])), flush=True)


def _measure(shape, b: int, global_batch: int, dp: int, threads: int) -> tuple[float, dict[str, float]]:
    """(fp32 GEMM FLOP/s, seconds per part of one optimizer step) measured in this process."""
    import torch
    import torch.nn.functional as F

    accum = max(1, global_batch // (b * dp))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        h, f, L, V, s = shape.hidden, shape.ffn_dim, shape.layers, shape.vocab, shape.seq_len
        M = b * s
        m = shape.mlp_factor
        linears = [(h, h + 2 * shape.kv_dim), (h, h), (h, m * f), (f, h)]
        gemm_s, gemm_flops = 0.0, 0.0
        for k, n in linears + [(h, V)]:
            reps = L if (k, n) != (h, V) else 1
            for (p, q, r) in ((M, k, n), (M, n, k), (k, M, n)):  # forward, d_input, d_weight
                a, w = torch.randn(p, q), torch.randn(q, r)
                gemm_s += reps * _timed(lambda a=a, w=w: a @ w)
                gemm_flops += reps * 2 * p * q * r
        parts = {"gemm": gemm_s}

        def fwd_bwd(fn, *shapes):
            xs = [torch.randn(*sh, requires_grad=True) for sh in shapes]
            g = torch.randn_like(fn(*xs))
            return _timed(lambda: torch.autograd.grad(fn(*xs), xs, g))

        hd, heads, kv_heads = shape.head_dim, shape.heads, shape.kv_head_count
        qkv = [(b, heads, s, hd), (b, kv_heads, s, hd), (b, kv_heads, s, hd)]
        gqa = kv_heads != heads
        parts["attention"] = L * fwd_bwd(
            lambda q, k_, v: F.scaled_dot_product_attention(q, k_, v, is_causal=True, enable_gqa=gqa), *qkv)
        if shape.position == "rope":  # the trainer's rotation of q and k: fp32 x * cos + rotate_half(x) * sin
            cos, sin = torch.randn(s, hd), torch.randn(s, hd)

            def rotate(x):
                return x * cos + torch.cat((-x[..., hd // 2:], x[..., :hd // 2]), dim=-1) * sin

            parts["rope"] = L * (fwd_bwd(rotate, qkv[0]) + fwd_bwd(rotate, qkv[1]))
        norm = torch.nn.LayerNorm(h) if shape.norm == "layernorm" else torch.nn.RMSNorm(h)
        parts["norms"] = (2 * L + 1) * fwd_bwd(norm, (M, h))
        if shape.mlp == "swiglu":
            parts["activation"] = L * fwd_bwd(lambda u: F.silu(u[:, :f]) * u[:, f:], (M, 2 * f))
        else:
            parts["activation"] = L * fwd_bwd(lambda u: F.gelu(u, approximate="tanh"), (M, f))
        parts["residual"] = 2 * L * fwd_bwd(lambda x, y: x + y, (M, h), (M, h))
        tgt = torch.randint(0, V, (M,))
        parts["loss"] = fwd_bwd(lambda z: F.cross_entropy(z, tgt), (M, V))
        emb = torch.nn.Embedding(V, h)
        ids = torch.randint(0, V, (b, s))
        parts["embedding"] = _timed(lambda: torch.autograd.grad(emb(ids).sum(), emb.weight))
        parts = {k: v * accum for k, v in parts.items()}

        params = [torch.nn.Parameter(torch.randn(n)) for n in _param_sizes(shape)]
        for p in params:
            p.grad = torch.randn_like(p)
        opt = torch.optim.AdamW(params, foreach=True)
        parts["optimizer"] = _timed(opt.step)
        parts["clip"] = _timed(lambda: torch.nn.utils.clip_grad_norm_(params, 1.0))
        if dp > 1:
            flat = torch.randn(sum(p.numel() for p in params))
            dst = torch.empty_like(flat)
            parts["allreduce"] = 2 * (dp - 1) / dp * 2 * _timed(lambda: dst.copy_(flat))  # ring: read + add
    finally:
        torch.set_num_threads(before)
    return gemm_flops / gemm_s, parts


def _param_sizes(shape) -> list[int]:
    """Element counts of the model's parameter tensors (the trainer's, :func:`clustertrain.core.model_shape.
    parameter_tensors`), q/k/v and the SwiGLU gate/up fused per block as this measurement times them."""
    h, f, m, k = shape.hidden, shape.ffn_dim, shape.mlp_factor, shape.kv_dim
    n = shape.norm_params // shape.norm_tensors
    biases = [h + 2 * k, h, m * f, h] if shape.bias else []
    layer = [(h + 2 * k) * h, h * h, m * f * h, f * h] + biases + [n] * (2 * shape.norm_tensors)
    positions = [shape.seq_len * h] if shape.position == "learned" else []
    out = layer * shape.layers + [shape.vocab * h] + positions + [n] * shape.norm_tensors
    return out + ([] if shape.tie_embeddings else [shape.vocab * h])


if __name__ == "__main__":
    _worker_main()
