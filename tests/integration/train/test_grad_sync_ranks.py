"""``parallelism.grad_sync`` on real gloo ranks, the collectives counted as they run.

Counting: ``torch.profiler`` records every ``c10d::_allgather_base_`` and ``c10d::_reduce_scatter_base_`` the rank
dispatches — the process group's own ops (on gloo the reduce-scatter runs as an all-reduce: ``gloo:all_reduce``),
not a mock or a wrapper — with their tensors' shapes (``record_shapes``): an all-gather's output and a
reduce-scatter's input are what one data-parallel group carries (FSDP2 pads each rank's shard to the same size; the
model below has no dim 0 the 2 ranks do not divide, so there is no padding). Bytes are counted in the dtype each
collective runs in (the layout's ``param_dtype`` for gathers, ``reduce_dtype`` for reduce-scatters: fp32 here).

World 2 (fsdp 2, 3 micro-batches per step): ``per_microbatch`` reduce-scatters each FSDP2 group (2 blocks and the
root) once per micro-batch, ``per_step`` once per step; both train the same losses and parameters within fp32
summation order (the gradients are summed over micro-batches before or after the reduction: ~1e-7 relative per
step; 4 steps of AdamW at lr 1e-2 keep the difference below 1e-5, a skipped or doubled micro-batch moves the loss
by > 1e-2); the planner's traffic (:func:`clustertrain.plan.traffic.data_parallel_traffic`) is the counted
collectives and bytes, and its ``per_step`` buffers (:func:`clustertrain.plan.memory.buffer_bytes`) are the
gathered parameters and unsharded gradients a rank holds between two micro-batches — for the classic model and a
Llama-style one (rotary positions, grouped-query attention, no biases: the ``llama-`` runs).

World 4 (pp 2 x fsdp 2, 1F1B, 4 micro-batches): each FSDP2 group of a stage is gathered once per step, not once per
micro-batch and again for its backward (``reshard_after_forward`` is false under pp), and reduce-scattered once.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from tests.support.ranks import launch_ranks

pytestmark = pytest.mark.slow

ARCH = dict(layers=2, hidden=64, heads=4, seq_len=32, vocab=192, mlp="swiglu", norm="rmsnorm", tie_embeddings=False)
#: the ``llama-`` runs: rotary positions, grouped-query attention (wk, wv [2 x 16, 64]), no linear biases
LLAMA = dict(ARCH, kv_heads=2, position="rope", bias=False)
STEPS, MICRO = 4, 2
COLLECTIVES = {"c10d::_allgather_base_": "gathers", "c10d::_reduce_scatter_base_": "reduces"}


# -- the ranks' side ------------------------------------------------------------------------------
def counted(run) -> dict:
    """The all-gathers and reduce-scatters ``run()`` dispatches on this rank: count and elements moved."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        run()
    out = {"gathers": 0, "reduces": 0, "gather_numel": 0, "reduce_numel": 0}
    for event in prof.events():
        kind = COLLECTIVES.get(event.name)
        if kind is None:
            continue
        out[kind] += 1
        # all-gather (output, input, ...): the gathered tensor; reduce-scatter (output, input, ...): the unsharded one
        shape = event.input_shapes[0] if kind == "gathers" else event.input_shapes[1]
        out["gather_numel" if kind == "gathers" else "reduce_numel"] += math.prod(shape)
    return out


def held_bytes(module) -> int:
    """Bytes of the gathered parameters and the unsharded (unreduced) gradients FSDP2 holds on this rank now."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_param import ShardedState

    total = 0
    for m in module.modules():
        if not isinstance(m, FSDPModule):
            continue
        for group in m._get_fsdp_state()._fsdp_param_groups:
            for p in group.fsdp_params:
                if p.sharded_state == ShardedState.UNSHARDED:
                    total += p._unsharded_param.numel() * p._unsharded_param.element_size()
                grad = p.unsharded_accumulated_grad
                if grad is None and hasattr(p, "_unsharded_param"):
                    grad = p._unsharded_param.grad
                if grad is not None:
                    total += grad.numel() * grad.element_size()
    return total


def batches_of(step: int, accum: int, dp_rank: int, arch):
    import torch

    gen = torch.Generator().manual_seed(1000 + step)
    data = torch.randint(0, arch.vocab, (accum * MICRO * 8, arch.seq_len + 1), generator=gen)
    start = dp_rank * accum * MICRO
    mine = data[start:start + accum * MICRO].view(accum, MICRO, arch.seq_len + 1)
    return [(b[:, :-1], b[:, 1:]) for b in mine]


def train_flat(grad_sync: str, world: int, arch_kw: dict = ARCH) -> dict:
    import torch
    import torch.distributed as dist

    from clustertrain.core.parallel_layout import resolve_layout
    from clustertrain.train.config import ArchConfig, ParallelismConfig, TrainingConfig
    from clustertrain.train.optim import build_optimizer
    from clustertrain.train.parallel import build_parallel_model

    arch = ArchConfig(**arch_kw)
    layout = resolve_layout(ParallelismConfig(zero_stage=3, grad_sync=grad_sync), world, on_gpu=False)
    accum = 3
    cfg = TrainingConfig(max_steps=STEPS, micro_batch=MICRO, global_batch=MICRO * accum * world, lr=1e-2)
    pm = build_parallel_model(arch, arch.vocab, layout, torch.device("cpu"), seed=11)
    optimizer = build_optimizer(pm.model, cfg)
    rank = dist.get_rank()
    losses, counts, held = [], [], None
    for step in range(STEPS):
        batches = batches_of(step, accum, layout.dp_rank(rank), arch)
        box = {}

        def run() -> None:
            box["loss"] = pm.forward_backward_step(batches, 1.0 / accum)

        if step == 1:  # a step after the first (the optimizer's states exist), counted micro-batch by micro-batch
            def run() -> None:  # noqa: F811
                nonlocal held
                total = pm.forward_backward(*batches[0], 1.0 / accum, sync=False)
                held = held_bytes(pm.module)  # between two micro-batches: what per_step keeps
                for x, y in batches[1:-1]:
                    total += pm.forward_backward(x, y, 1.0 / accum, sync=False)
                box["loss"] = total + pm.forward_backward(*batches[-1], 1.0 / accum, sync=True)
        counts.append(counted(run))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss = box["loss"].clone()
        dist.all_reduce(loss)
        losses.append(float(loss) / world)
    params = {fqn: p.full_tensor().detach().flatten()[:64].tolist() for fqn, p in pm.model.named_parameters()}
    return {"losses": losses, "counts": counts, "held": held, "params": params, "layout": layout.to_dict(),
            "accum": accum}


def train_piped(world: int) -> dict:
    import torch
    import torch.distributed as dist

    from clustertrain.core.parallel_layout import resolve_layout
    from clustertrain.train.config import ArchConfig, ParallelismConfig
    from clustertrain.train.parallel import build_parallel_model

    arch = ArchConfig(**ARCH)
    # reshard_after_forward: true as written; under pp the layout makes it false
    layout = resolve_layout(ParallelismConfig(zero_stage=3, pp=2, reshard_after_forward=True), world, on_gpu=False)
    accum = 4
    pm = build_parallel_model(arch, arch.vocab, layout, torch.device("cpu"), seed=11, microbatches=accum)
    rank = dist.get_rank()
    states = {id(m._get_fsdp_state()): m._get_fsdp_state() for stage in pm.pipeline.stages
              for m in stage.submod.modules() if hasattr(m, "_get_fsdp_state")}  # each stage view is a FSDP2 root
    groups = sum(len(state._fsdp_param_groups) for state in states.values())
    counts = []
    for step in range(3):
        batches = batches_of(step, accum, layout.dp_rank(rank), arch)
        counts.append(counted(lambda: pm.forward_backward_step(batches, 1.0 / accum)))
        pm.model.zero_grad(set_to_none=True)
    return {"counts": counts, "groups": groups, "layout": layout.to_dict()}


def worker(out: Path) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world == 2:
        result = {f"{prefix}{g}": train_flat(g, world, arch) for prefix, arch in (("", ARCH), ("llama-", LLAMA))
                  for g in ("per_microbatch", "per_step")}
    else:
        mine = train_piped(world)
        every: list = [None] * world
        dist.all_gather_object(every, mine)
        result = {"ranks": every}
    if rank == 0:
        (out / "result.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


# -- the test's side ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def flat(tmp_path_factory) -> dict:
    return launch_ranks(__file__, tmp_path_factory.mktemp("grad-sync"), 2, timeout=600)


@pytest.fixture(scope="module")
def piped(tmp_path_factory) -> dict:
    return launch_ranks(__file__, tmp_path_factory.mktemp("grad-sync-pp"), 4, timeout=600)


GROUPS = ARCH["layers"] + 1  # FSDP2 groups of the flat model: each block and the root


def test_per_step_reduce_scatters_once_per_step_per_microbatch_once_per_micro_batch(flat):
    accum = flat["per_step"]["accum"]
    for counts in flat["per_step"]["counts"]:
        assert counts["reduces"] == GROUPS
    for counts in flat["per_microbatch"]["counts"]:
        assert counts["reduces"] == accum * GROUPS
    # the gathers: per_step keeps the blocks gathered from one micro-batch's backward into the next forward
    assert flat["per_step"]["counts"][2]["gathers"] < flat["per_microbatch"]["counts"][2]["gathers"]


def test_both_choices_train_the_same_losses_and_parameters(flat):
    a, b = flat["per_microbatch"], flat["per_step"]
    assert b["losses"] == pytest.approx(a["losses"], rel=1e-5)
    assert a["losses"][-1] != a["losses"][0]
    for fqn, values in a["params"].items():
        if fqn.endswith("attn.wk.bias"):  # true gradient 0: rounding noise AdamW normalises (test_parallel_layouts.py)
            continue
        assert b["params"][fqn] == pytest.approx(values, abs=1e-5), fqn


def test_the_planners_traffic_and_buffers_are_what_the_ranks_send_and_hold(flat):
    from clustertrain.core.model_shape import ModelShape
    from clustertrain.core.parallel_layout import ParallelLayout
    from clustertrain.plan.memory import DTYPE_BYTES, buffer_bytes
    from clustertrain.plan.traffic import data_parallel_traffic
    from clustertrain.train.config import ArchConfig

    for name, run in flat.items():
        arch = ArchConfig(**(LLAMA if name.startswith("llama-") else ARCH))
        shape = ModelShape.from_arch(arch, arch.vocab)
        layout = ParallelLayout(**run["layout"])
        choice = name.removeprefix("llama-")
        assert layout.grad_sync == choice
        planned = data_parallel_traffic(shape, layout, run["accum"], gpus_per_node=1, network_gbps=None)
        for counts in run["counts"][1:]:   # every step after the first (the first one's are the same, uncounted here)
            sent = (DTYPE_BYTES[layout.param_dtype] * counts["gather_numel"]
                    + DTYPE_BYTES[layout.reduce_dtype] * counts["reduce_numel"])
            assert planned.group_bytes == sent, choice
            assert planned.reduces * GROUPS == counts["reduces"], choice
            assert planned.gathers * planned.params == pytest.approx(counts["gather_numel"]), choice
        if choice == "per_step":
            assert buffer_bytes(shape, layout) == run["held"], name
    assert flat["per_microbatch"]["held"] < flat["per_step"]["held"]  # per_microbatch keeps no unsharded gradient
    # grouped-query attention and no biases: the llama model moves less than the classic one of the same width
    assert flat["llama-per_step"]["counts"][1]["reduce_numel"] < flat["per_step"]["counts"][1]["reduce_numel"]


def test_pipelined_fsdp_gathers_each_group_once_per_step(piped):
    for rank, got in enumerate(piped["ranks"]):
        assert got["layout"]["reshard_after_forward"] is False and got["layout"]["grad_sync"] == "per_step"
        assert got["groups"] >= 2, rank  # a block and the stage's root
        # the first step also runs PipelineStage's shape inference (a forward of its own): the steps after it
        for counts in got["counts"][1:]:
            assert counts["gathers"] == got["groups"], (rank, counts)  # not 4 micro-batches x (forward + backward)
            assert counts["reduces"] == got["groups"], (rank, counts)


if __name__ == "__main__":
    worker(Path(sys.argv[1]))
