"""The planner's pipeline stages for the built-in trainer: the stage split is the trainer's own, each rank's model
states are the tensors of the stages it holds (against the trainer's stage models, built on the meta device), the
micro-batches in flight per schedule, the FSDP2 buffers of a pipelined stage, the bubble in the step time, the
schedule's micro-batch rule per node count, the pp hint, the data-parallel traffic, and examples/p5-30b.yaml.
(The gloo test tests/integration/train/test_pipeline_layouts.py compares the same bytes with every real rank.)"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from clustertrain.plan.allocate import Hardware, ModelSpec, evaluate
from clustertrain.plan.memory import (
    TrainerMemory,
    activation_bytes,
    buffer_bytes,
    estimate_memory,
    in_flight_chunks,
    layer_activation_bytes,
    rank_parts,
    stage_split,
    trainer_state_bytes,
)
from clustertrain.plan.plan import make_plan
from clustertrain.plan.render import render_plan
from clustertrain.core.model_shape import ModelShape, parameter_tensors
from clustertrain.plan.traffic import data_parallel_traffic
from clustertrain.resolve import load_project
from clustertrain.train.config import ArchConfig, ParallelismConfig
from clustertrain.core.parallel_layout import ParallelLayout, resolve_layout

ROOT = Path(__file__).resolve().parents[3]
P5_30B = ROOT / "examples" / "p5-30b.yaml"
H100 = Hardware(gpus_per_node=8, gpu_memory_gib=79.6, peak_flops=989e12, headroom=0.10, framework_gib=3.0,
                network_gbps=3200)
#: Llama-1 33B, the shape of examples/p5-30b.yaml
LLAMA_30B = ModelShape(layers=60, hidden=6656, heads=52, seq_len=4096, vocab=32000, ffn_dim=17920, mlp="swiglu",
                       norm="rmsnorm", tie_embeddings=False)
#: small untied shapes; 7 layers do not divide into 2 or 3 stages, and the big vocabulary moves the split
SMALL = [dict(layers=7, hidden=64, heads=4, seq_len=32, vocab=4096, mlp="swiglu", norm="rmsnorm", tie_embeddings=False),
         dict(layers=8, hidden=32, heads=2, seq_len=16, vocab=64, tie_embeddings=False, dropout=0.1),
         # Llama-style: rope (no pos_emb on the first stage), grouped-query attention, no linear biases
         dict(layers=6, hidden=64, heads=4, kv_heads=2, seq_len=32, vocab=4096, position="rope", bias=False,
              mlp="swiglu", norm="rmsnorm", tie_embeddings=False)]


def pipelined(world: int, pp: int, dp: int = 1, tp: int = 1, v: int = 1, **kw) -> ParallelLayout:
    schedule = kw.pop("schedule", "interleaved_1f1b" if v > 1 else "1f1b")
    return ParallelLayout(world=world, dp=dp, tp=tp, pp=pp, virtual_stages=v, schedule=schedule, **kw)


@pytest.mark.parametrize("kw", SMALL)
@pytest.mark.parametrize("stages", [2, 3, 4])
def test_the_stage_split_is_the_trainers(kw, stages):
    from clustertrain.train.parallel.pipeline import rank_layers

    arch = ArchConfig(**kw)
    shape = ModelShape.from_arch(arch, kw["vocab"])
    layout = pipelined(stages, stages)
    split, _ = rank_layers(arch, kw["vocab"], layout, 0)
    assert stage_split(shape, stages) == split
    assert sum(len(r) for r in split) == arch.layers
    if kw["layers"] == 7 and stages == 2:  # uneven: the output layer (h x V = 4.6 blocks' worth) goes with the last
        assert [len(r) for r in split] == [6, 1]


@pytest.mark.parametrize("kw,pp,v", [(kw, pp, v) for kw in SMALL for pp, v in [(2, 1), (3, 1), (2, 2)]
                                     if kw["layers"] % (pp * v) == 0 or v == 1])  # interleaving: equal stages
def test_each_rank_holds_the_tensors_of_its_stages(kw, pp, v):
    """Unsharded (dp 1, tp 1): every rank's bytes are its stage holder's tensors — the trainer's
    ``build_stage_model``, on the meta device — at 4 + 4 + 8 B per element and 4 B per tensor."""
    from clustertrain.train.parallel.pipeline import build_stage_model

    arch = ArchConfig(**kw)
    shape = ModelShape.from_arch(arch, kw["vocab"])
    layout = pipelined(pp, pp, v=v)
    held, names = 0, {}
    for rank in range(pp):
        holder, _, stages = build_stage_model(arch, kw["vocab"], layout, rank)
        n, tensors = sum(p.numel() for p in holder.parameters()), len(list(holder.parameters()))
        names |= {name: tuple(p.shape) for name, p in holder.named_parameters()}
        assert trainer_state_bytes(shape, layout, rank) == (4 * n, 4 * n, 8 * n + 4 * tensors), rank
        parts = rank_parts(shape, layout, rank)
        assert (parts.stages, parts.first, parts.last) == (tuple(stages), 0 in stages, pp * v - 1 in stages)
        held += n
    assert held == shape.total_params()  # every parameter on exactly one pipeline rank (untied: no copy)
    assert names == {t.name: t.shape for t in parameter_tensors(shape)}  # the stages hold the whole model's names


def test_tp_and_fsdp_split_each_stage_as_they_split_the_model():
    """dp 3 x tp 2 x pp 2: the dp ranks of a pipeline rank partition its tp-local stage exactly (FSDP2), the first
    holding the most (ceil rows); its pipeline rank, not its dp or tp rank, decides a rank's stages."""
    shape = ModelShape.from_arch(ArchConfig(**SMALL[0]), 4096)
    layout = pipelined(12, 2, dp=3, tp=2, zero_stage=3)
    for pp_rank in range(2):
        for tp_rank in range(2):
            tp_local = trainer_state_bytes(shape, pipelined(4, 2, tp=2), 2 * pp_rank + tp_rank)  # unsharded over dp
            parts = [trainer_state_bytes(shape, layout, (pp_rank * 3 + d) * 2 + tp_rank) for d in range(3)]
            assert sum(p.params for p in parts) == tp_local.params
            steps = tp_local.optimizer - 2 * tp_local.params              # AdamW step: 4 B per tensor on every rank
            assert all(p.optimizer - 2 * p.params == steps for p in parts)
            assert parts[0] == max(parts)
        ranks = range(pp_rank * 6, pp_rank * 6 + 6)
        assert {rank_parts(shape, layout, r) for r in ranks} == {rank_parts(shape, pipelined(2, 2), pp_rank)}


def test_micro_batches_in_flight_per_schedule():
    assert [in_flight_chunks(4, 1, 8, r, "gpipe") for r in range(4)] == [8] * 4      # every forward before a backward
    assert [in_flight_chunks(4, 1, 8, r, "1f1b") for r in range(4)] == [4, 3, 2, 1]  # warm-up + 1
    assert in_flight_chunks(4, 1, 2, 0, "1f1b") == 2                                 # never more than m
    # interleaved (torch's ScheduleInterleaved1F1B warm-up = Megatron's): 2 (pp - r - 1) + (v - 1) pp + 1 chunks
    assert [in_flight_chunks(4, 2, 8, r, "interleaved_1f1b") for r in range(4)] == [11, 9, 7, 5]


@pytest.mark.parametrize("schedule,expect", [("gpipe", [8, 8]), ("1f1b", [2, 1])])
def test_activations_are_the_in_flight_micro_batches_of_the_stage(schedule, expect):
    """pp 2 over 8 layers with dropout: rank 0 holds 4 blocks x its in-flight micro-batches + an embedding dropout
    mask each; rank 1 its 4 blocks + the output layer's inputs and fp32 logits (gpipe: for all 8)."""
    sh = ModelShape.from_arch(ArchConfig(**SMALL[1]), 64)
    layout = pipelined(2, 2, schedule=schedule, param_dtype="bf16")
    per_layer = layer_activation_bytes(sh, layout)
    sbh = sh.seq_len * sh.hidden
    logits = 2 * 2 * sbh + 4 * sh.seq_len * sh.vocab
    assert activation_bytes(sh, layout, m=8, pp_rank=0) == expect[0] * (4 * per_layer + sbh)
    assert activation_bytes(sh, layout, m=8, pp_rank=1) == expect[1] * 4 * per_layer + (8 if schedule == "gpipe" else 1) * logits
    # 1F1B's first stage: pp micro-batches x L / pp blocks = one micro-batch through all L (no activation saving)
    flat = activation_bytes(sh, replace(layout, pp=1, world=1), m=8)
    if schedule == "1f1b":
        assert activation_bytes(sh, layout, m=8, pp_rank=0) == flat - logits + sbh


def test_a_pipelined_fsdp_stage_keeps_its_blocks_gathered_with_unsharded_gradients():
    shape = LLAMA_30B
    layout = pipelined(256, 2, dp=32, tp=4, zero_stage=3, sequence_parallel=True, param_dtype="bf16",
                       reshard_after_forward=False)
    tp_local = trainer_state_bytes(shape, pipelined(8, 2, tp=4), 0).params // 4   # stage 0 on a tp rank, unsharded
    assert buffer_bytes(shape, layout, 0) == (2 + 4) * tp_local                   # bf16 gathered + fp32 gradients
    assert buffer_bytes(shape, replace(layout, reshard_after_forward=True), 0) == buffer_bytes(shape, layout, 0)
    assert buffer_bytes(shape, replace(layout, reduce_dtype="bf16"), 0) == (2 + 2) * tp_local
    ddp = pipelined(4, 2, dp=2, param_dtype="bf16")
    held = trainer_state_bytes(shape, pipelined(2, 2), 1).params // 4
    assert buffer_bytes(shape, ddp, 2) == (4 + 2) * held                          # DDP: buckets + autocast copy


def test_the_most_loaded_pipeline_rank_is_reported():
    layout = pipelined(256, 2, dp=32, tp=4, zero_stage=3, sequence_parallel=True, param_dtype="bf16",
                       reshard_after_forward=False)
    mem = estimate_memory(LLAMA_30B, layout, m=32, framework_gib=3.0)
    assert isinstance(mem, TrainerMemory)
    assert (mem.pp_rank, mem.stages, mem.layers, mem.in_flight) == (0, (0,), 30, 2)
    from clustertrain.plan.memory import rank_memory

    last = rank_memory(LLAMA_30B, layout, 1, m=32, framework_gib=3.0)
    assert last.total_bytes < mem.total_bytes and last.layers == 30 and last.in_flight == 1
    assert round(mem.total_bytes / 1024**3, 1) == 42.1                              # examples/p5-30b.yaml's figure


def spec(par: ParallelismConfig, shape: ModelShape = LLAMA_30B, **kw) -> ModelSpec:
    base = dict(tokens=300_000_000_000, global_batch=1024, micro_batch=1, index=0)
    base.update(kw)
    return ModelSpec(name="m", shape=shape, parallelism=par, **base)


PP2 = ParallelismConfig(zero_stage=3, tp=4, pp=2, sequence_parallel=True, reshard_after_forward=False)


def test_the_builtin_trainer_plans_pipeline_stages_with_their_bubble():
    ev = evaluate(spec(PP2), H100, 256)
    assert ev.ok, ev.reasons
    assert (ev.layout.dp, ev.layout.pp, ev.microbatches) == (32, 2, 32)
    assert ev.bubble == 1 / 32
    flat = evaluate(spec(PP2.model_copy(update={"pp": 1})), H100, 256)
    assert flat.bubble == 0 and ev.step_seconds == pytest.approx(flat.step_seconds * (1 + 1 / 32))
    # an uneven split is the built-in trainer's (Megatron refuses it): 60 layers over pp 7
    odd = evaluate(spec(PP2.model_copy(update={"pp": 7})), H100, 7 * 4 * 8)
    assert odd.ok and odd.memory.layers == 9


def test_the_schedule_needs_its_micro_batches_on_each_count():
    ev = evaluate(spec(PP2.model_copy(update={"pp": 4}), global_batch=64), H100, 512)   # dp 32: 2 micro-batches
    assert ev.reasons == ["models[0].parallelism.schedule: 1f1b needs at least pp=4 micro-batches per step, but "
                          "global_batch / (micro_batch x dp) = 2; raise training.global_batch to a multiple of 4 x "
                          "micro_batch x dp, lower micro_batch, or use schedule: gpipe (64 node(s) x 8 = 512 GPUs)"]
    assert evaluate(spec(PP2.model_copy(update={"pp": 4, "schedule": "gpipe"}), global_batch=64), H100, 512).ok


def test_tied_embeddings_across_stages_are_refused_naming_the_field():
    ev = evaluate(spec(PP2, shape=replace(LLAMA_30B, tie_embeddings=True)), H100, 256)
    assert ev.reasons[0].startswith("models[0].model.tie_embeddings: true with pp=2") and ev.memory is None


def test_the_hint_offers_pp_with_its_memory_and_says_when_it_is_the_only_way():
    """Already at zero_stage 3, recompute full and the largest tp that splits 52 heads within a node: pp 4 (its
    stages gather half the blocks pp 2's do) is what is left."""
    par = PP2.model_copy(update={"recompute": "full", "reshard_after_forward": True})
    tight = replace(H100, gpu_memory_gib=28.0)
    reason = evaluate(spec(par), tight, 256).reasons[0]
    assert reason.startswith("does not fit: needs ")
    pp4 = evaluate(spec(par.model_copy(update={"pp": 4})), tight, 256)
    assert pp4.ok
    assert reason.endswith(f"try parallelism.pp: 4 (each rank then holds a quarter of the layers: "
                           f"{pp4.memory.total_bytes / 1024**3:.1f} GiB): the only layout setting left (zero_stage 3 "
                           "already shards every state over dp, recompute full, no tp above 4 splits the model within a "
                           "node)")


def test_data_parallel_traffic_per_step():
    """FSDP without pp: a gather and a reduce-scatter per micro-batch; with pp and reshard_after_forward false: one
    each per step. A node holds 8 / tp ranks' worth of groups; each collective brings (dp - g) / dp of the group's
    tensor into the node."""
    flat = resolve_layout(PP2.model_copy(update={"pp": 1}), 256, on_gpu=True)      # fsdp 64 x tp 4, m = 16
    t = data_parallel_traffic(LLAMA_30B, flat, 16, 8, 3200)
    p = trainer_state_bytes(LLAMA_30B, ParallelLayout(world=4, dp=1, tp=4)).params // 4   # tp-local elements
    assert (t.params, t.gathers, t.reduces) == (p, 16, 16)
    assert t.node_bytes == int(4 * 16 * 6 * p * (64 - 2) / 64)                     # 4 groups, g = 2 of each per node
    assert t.seconds == pytest.approx(t.node_bytes / 400e9)
    piped = resolve_layout(PP2, 256, on_gpu=True)
    t2 = data_parallel_traffic(LLAMA_30B, piped, 32, 8, 3200)
    assert (t2.gathers, t2.reduces) == (1, 1) and t2.node_bytes < t.node_bytes / 30
    one_node = resolve_layout(ParallelismConfig(zero_stage=3), 8, on_gpu=True)
    assert data_parallel_traffic(LLAMA_30B, one_node, 128, 8, 3200).seconds is None  # NVLink only


def test_the_p5_30b_example_plans_its_layout():
    plan = make_plan(load_project(P5_30B))
    m = plan.model("llama-30b")
    assert plan.feasible and (m.nodes, m.gpus) == (32, 256)
    assert (m.layout["tp"], m.layout["pp"], m.layout["dp"]) == (4, 2, 32)          # tp > 1, pp > 1, dp > 1
    assert m.layout_text.endswith("most loaded: pp rank 0 (stage 0, 30 layers, 2 micro-batches in flight)")
    assert (m.microbatches, m.memory_pp_rank) == (32, 0) and m.pipeline_bubble == 1 / 32
    assert m.dp_traffic["gathers"] == 1 and m.dp_traffic["seconds"] < 0.05 * m.dp_traffic["compute_seconds"]
    text = render_plan(plan, "table")
    for needle in ("memory per GPU (the most loaded rank)", "41.9 GiB", "8.65s per step = 8.38s compute at 40% MFU + "
                   "0.26s pipeline bubble (pp 2 - 1) / (32 micro-batches) = 3.1%", "7.2 d"):
        assert needle in text, needle
