"""Feasibility reasons (each layout problem naming its field) and the allocation of nodes across models,
on plain specs with a ``ParallelismConfig`` — the section the trainer reads."""

from __future__ import annotations

from dataclasses import replace

from clustertrain.plan.allocate import Hardware, ModelSpec, allocate, evaluate
from clustertrain.plan.frameworks import Framework
from clustertrain.core.model_shape import ModelShape
from clustertrain.train.config import ParallelismConfig

H200 = Hardware(gpus_per_node=8, gpu_memory_gib=140.4, peak_flops=989e12, headroom=0.10, framework_gib=3.0)
H100 = replace(H200, gpu_memory_gib=79.6)
SMALL = ModelShape(layers=32, hidden=4096, heads=32, seq_len=4096, vocab=32000, ffn_dim=16384)
LARGE = ModelShape(layers=40, hidden=5120, heads=40, seq_len=4096, vocab=32000, ffn_dim=20480)
FSDP = ParallelismConfig(zero_stage=3)
DDP = ParallelismConfig(zero_stage=0)
#: a framework that only replicates (what a DDP-only trainer offers): the planner refuses what it lacks
DDP_ONLY = Framework("ddp-only", "a test framework", zero_stages=(0,), max_tp=1, pp=(1,), recompute=("none",),
                     sequence_parallel=False, param_dtypes=("fp32",), flash_attention=True)


def spec(name="m", shape=SMALL, par=FSDP, **kw) -> ModelSpec:
    base = dict(tokens=700_000_000_000, global_batch=1232, micro_batch=1, parallelism=par)
    base.update(kw)
    return ModelSpec(name=name, shape=shape, **base)


def test_impossible_layouts_name_their_field():
    odd = replace(SMALL, heads=12, hidden=4104)
    ev = evaluate(spec(shape=odd, par=ParallelismConfig(zero_stage=3, tp=8), global_batch=64, index=6), H200, 80)
    assert ev.reasons[0].startswith("models[6].parallelism.tp: tp=8 does not divide model.heads=12; valid tp: 1, 2, 3, 4, 6, 12")
    ev = evaluate(spec(par=ParallelismConfig(zero_stage=3, tp=16), index=0), H200, 16)
    assert ev.reasons[0].startswith("models[0].parallelism.tp: tp=16 is larger than the 8 ranks of a node")
    ev = evaluate(spec(par=ParallelismConfig(zero_stage=3, tp=4)), replace(H200, gpus_per_node=2), 2)
    assert ev.reasons[0].startswith("parallelism.tp: tp=4 is larger than the 2 ranks")
    ev = evaluate(spec(par=ParallelismConfig(zero_stage=3, dp=8), index=2), H200, 16)
    assert ev.reasons == ["models[2].parallelism.dp: dp=8 x tp=1 x pp=1 = 8 but the job has 16 ranks; set dp: auto (= 16) "
                          "(2 node(s) x 8 = 16 GPUs)"]


def test_a_setting_the_framework_lacks_is_refused_not_replaced():
    ev = evaluate(spec(par=ParallelismConfig(zero_stage=3, recompute="full"), framework=DDP_ONLY, index=1), H200, 88)
    assert ev.reasons[:3] == [
        "models[1].parallelism.zero_stage: zero_stage 3 is not implemented by the ddp-only framework (zero_stage: 0)",
        "models[1].parallelism.recompute: recompute full is not implemented by the ddp-only framework (recompute: none)",
        "models[1].parallelism.param_dtype: param_dtype bf16 is not implemented by the ddp-only framework (param_dtype: fp32)",
    ]
    assert ev.memory is None  # no memory is computed for a layout that cannot run


def test_world_size_and_global_batch_divisibility():
    ev = evaluate(spec(par=ParallelismConfig(zero_stage=3, tp=8), global_batch=1000), H200, 88)
    assert ev.reasons == ["global_batch 1000 is not a multiple of micro_batch x dp = 1 x 11 on 11 node(s) x 8 = 88 GPUs"]
    ev = evaluate(spec(global_batch=1000), H200, 88)
    assert ev.reasons == ["global_batch 1000 is not a multiple of micro_batch x dp = 1 x 88 on 11 node(s) x 8 = 88 GPUs"]
    ev = evaluate(spec(par=ParallelismConfig(zero_stage=3, tp=8, sequence_parallel=True)), H200, 88)
    assert ev.ok and (ev.layout.dp, ev.layout.tp, ev.layout.sequence_parallel) == (11, 8, True)
    assert ev.layout.param_dtype == "bf16" and evaluate(spec(on_gpu=False), H200, 88).layout.param_dtype == "fp32"


def test_does_not_fit_says_by_how_much_and_what_to_set():
    ev = evaluate(spec(shape=LARGE, par=DDP), H100, 112)
    assert len(ev.reasons) == 1
    msg = ev.reasons[0]
    assert msg.startswith("does not fit: needs ") and "GiB per GPU (ddp 112, bf16 params) but 71.6 GiB is usable (79.6 GiB less 10% headroom)" in msg
    # only what fits alone on the 112 GPUs: recompute does not shrink DDP's 16 B/param enough, tp needs zero_stage 3
    assert msg.endswith("try parallelism.zero_stage: 3, parallelism.pp: 8 (each rank then holds 5 of the 40 layers: 64.0 GiB) "
                        "with model.tie_embeddings: false")  # DDP's 16 B/param over 8 stages: the first pp that fits
    assert not evaluate(spec(shape=LARGE, par=DDP.model_copy(update={"recompute": "selective"})), H100, 112).ok
    needed = float(msg.split("needs ")[1].split(" GiB")[0])
    assert needed == round(ev.memory.total_bytes / 1024**3, 1)
    assert evaluate(spec(shape=LARGE, par=FSDP), H100, 112).ok
    tight = replace(H100, gpu_memory_gib=20.0)
    msg = evaluate(spec(shape=LARGE, par=ParallelismConfig(zero_stage=3, reshard_after_forward=False, recompute="selective")),
                   tight, 112).reasons[0]
    assert msg.endswith("; try parallelism.tp: 4 with sequence_parallel: true")  # the smallest tp that fits; no pp does
    for tp, fits in ((4, True), (2, False)):
        par = ParallelismConfig(zero_stage=3, reshard_after_forward=False, recompute="selective", tp=tp, sequence_parallel=True)
        assert evaluate(spec(shape=LARGE, par=par), tight, 112).ok is fits
    sharded = ParallelismConfig(zero_stage=3, reshard_after_forward=False, recompute="selective")
    msg = evaluate(spec(shape=LARGE, par=sharded), replace(H100, gpu_memory_gib=12.0), 112).reasons[0]
    assert msg.endswith("; try these together: parallelism.reshard_after_forward: true, parallelism.recompute: full, "
                        "parallelism.tp: 8 with sequence_parallel: true (5.4 GiB)")  # none fits alone
    msg = evaluate(spec(shape=LARGE, par=sharded), replace(H100, gpu_memory_gib=5.0), 112).reasons[0]
    assert msg.endswith("; no setting makes it fit on 112 GPUs (tried parallelism.reshard_after_forward: true, "
                        "parallelism.recompute: full, parallelism.tp with sequence_parallel: true, parallelism.pp alone "
                        "and together); use a smaller model or GPUs with more memory")


def test_hints_offer_only_what_the_framework_implements():
    msg = evaluate(spec(shape=LARGE, par=ParallelismConfig(param_dtype="fp32"), framework=DDP_ONLY), H100, 112).reasons[0]
    assert msg.endswith("; use a smaller model or GPUs with more memory") and "parallelism" not in msg
    smaller = evaluate(spec(shape=LARGE, par=ParallelismConfig(param_dtype="fp32"), micro_batch=2, global_batch=224,
                            framework=DDP_ONLY), H100, 112).reasons[0]
    assert smaller.endswith("; no setting makes it fit on 112 GPUs (tried training.micro_batch: 1); use a smaller model "
                            "or GPUs with more memory")  # a smaller micro_batch is tried, and does not fit either


def test_time_is_flops_over_gpus_peak_and_mfu():
    ev = evaluate(spec(mfu=0.4), H200, 88)
    flops = SMALL.flops_per_token() * 700e9
    assert ev.seconds == flops / (88 * 989e12 * 0.4)
    assert ev.step_seconds == SMALL.flops_per_token() * 1232 * 4096 / (88 * 989e12 * 0.4)


def test_seed_inputs_give_six_on_eleven_and_one_on_fourteen():
    specs = [spec(f"model-{i}") for i in range(1, 7)] + [spec("model-7", LARGE, tokens=460_000_000_000)]
    alloc = allocate(specs, H200, total_units=80, unit_gpus=8)
    assert alloc.units == {**{f"model-{i}": 11 for i in range(1, 7)}, "model-7": 14}
    assert alloc.idle_units == 0 and not alloc.infeasible and not alloc.problems


def test_a_fixed_dp_allows_only_its_node_count():
    alloc = allocate([spec("d", par=ParallelismConfig(zero_stage=3, dp=32), global_batch=1024)], H200, 10, 8)
    assert alloc.units == {"d": 4}
    never = allocate([spec("d", par=ParallelismConfig(zero_stage=3, dp=100), index=0)], H200, 10, 8)
    assert never.infeasible["d"][0].startswith("models[0].parallelism.dp: dp=100 x tp=1 x pp=1 = 100 but the job has 80 ranks")
    assert never.infeasible["d"][0].endswith("; no count from 1 to 10 nodes suits it")


def test_equal_models_split_evenly_and_leftovers_go_to_the_slowest():
    specs = [spec(f"m{i}", global_batch=1024) for i in range(4)]
    alloc = allocate(specs, H200, total_units=16, unit_gpus=8)
    assert sorted(alloc.units.values()) == [4, 4, 4, 4]
    # 3x the FLOPs on 10 nodes: max(3/b, 1/s) is least at b=7, s=3 (every count divides 8 x 2520)
    pair = [spec("big", tokens=2_100_000_000_000, global_batch=8 * 2520), spec("small", global_batch=8 * 2520)]
    assert allocate(pair, H200, total_units=10, unit_gpus=8).units == {"big": 7, "small": 3}
    # only 1, 2, 4, 8 divide 1024/8: the makespan is set by big on 4; the 2 free nodes then lift small to 4
    pair = [spec("big", tokens=2_100_000_000_000, global_batch=1024), spec("small", global_batch=1024)]
    alloc = allocate(pair, H200, total_units=8, unit_gpus=8)
    assert alloc.units == {"big": 4, "small": 4} and alloc.idle_units == 0


def test_fixed_nodes_are_honoured_and_more_than_the_cluster_is_infeasible():
    specs = [spec("fixed", fixed_nodes=22), spec("free")]
    alloc = allocate(specs, H200, total_units=44, unit_gpus=8)
    assert alloc.units["fixed"] == 22 and alloc.units["free"] == 22
    alloc = allocate([spec("huge", fixed_nodes=90)], H200, total_units=80, unit_gpus=8)
    assert alloc.infeasible == {"huge": ["plan.nodes=90 is more nodes than the cluster has (80)"]}


def test_too_small_cluster_is_a_plan_problem():
    specs = [spec(f"m{i}", fixed_nodes=11) for i in range(3)]
    alloc = allocate(specs, H200, total_units=30, unit_gpus=8)
    assert alloc.problems == [
        "the feasible models need at least 33 nodes together (m0 11, m1 11, m2 11) but the cluster has 30"
    ]


def test_deadline_limits_the_allocation():
    ok = allocate([spec("d", deadline_days=10.0)], H200, total_units=22, unit_gpus=8)
    assert ok.units == {"d": 22}
    late = allocate([spec("d", deadline_days=1.0)], H200, total_units=22, unit_gpus=8)
    assert "over the deadline of 1 days" in late.infeasible["d"][0]


def test_node_sharing_allocates_gpus():
    specs = [spec("a", global_batch=12), spec("b", global_batch=4, tokens=350_000_000_000)]
    alloc = allocate(specs, H200, total_units=16, unit_gpus=1)
    assert alloc.units["a"] == 12 and alloc.units["b"] == 4
