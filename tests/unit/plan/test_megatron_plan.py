"""The planner's Megatron-LM arithmetic (``models[].framework: megatron``): bytes per parameter with and without the
distributed optimizer, parameters per pipeline stage, activations of the micro-batches a stage holds under 1F1B,
the vocabulary padding and the pipeline bubble — computed here from the formulas, cross-checked against
Megatron-LM's own ``megatron/training/theoretical_memory_usage.py`` (run from the tag's source in the tarball),
and planned on the flagship with model-1 switched to Megatron."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from clustertrain.core.errors import ConfigError
from clustertrain.plan.allocate import Hardware, ModelSpec, evaluate
from clustertrain.plan.frameworks import BUILTIN, MEGATRON
from clustertrain.plan.megatron_memory import estimate_megatron_memory, megatron_vocab, stage_memory
from clustertrain.plan.memory import in_flight_chunks, pipeline_bubble
from clustertrain.plan.plan import make_plan
from clustertrain.plan.preflight import plan_findings, submit_blockers
from clustertrain.plan.render import render_plan
from clustertrain.core.model_shape import ModelShape
from clustertrain.resolve import load_project
from clustertrain.train.config import ArchConfig, ParallelismConfig
from clustertrain.core.parallel_layout import ParallelLayout
from tests.support.megatron_lm import megatron_source

ROOT = Path(__file__).resolve().parents[3]
P5E = ROOT / "examples" / "p5e-80x7.yaml"
H200 = Hardware(gpus_per_node=8, gpu_memory_gib=140.4, peak_flops=989e12, headroom=0.10, framework_gib=3.0)
H100 = replace(H200, gpu_memory_gib=79.6)
SMALL_6B = ModelShape(layers=32, hidden=4096, heads=32, seq_len=4096, vocab=32000, ffn_dim=16384)
LARGE_12B = ModelShape(layers=40, hidden=5120, heads=40, seq_len=4096, vocab=32000, ffn_dim=20480)
#: a small GPT with dropout (Megatron's formula assumes dropout masks), LayerNorm, biases, tied embeddings
TINY = ModelShape(layers=8, hidden=512, heads=8, seq_len=1024, vocab=1024, ffn_dim=2048, dropout=0.1)
MEGATRON_MODEL_1 = ["models.model-1.framework=megatron"]


def megatron_layout(world: int, tp: int = 1, pp: int = 1, zero_stage: int = 1, **kw) -> ParallelLayout:
    kw.setdefault("param_dtype", "bf16")
    return ParallelLayout(world=world, dp=world // (tp * pp), tp=tp, pp=pp, zero_stage=zero_stage, **kw)


def spec(par: ParallelismConfig, framework=MEGATRON, shape=SMALL_6B, **kw) -> ModelSpec:
    base = dict(tokens=700_000_000_000, global_batch=1232, micro_batch=1, index=0)
    base.update(kw)
    return ModelSpec(name="m", shape=shape, parallelism=par, framework=framework, **base)


# --- the formulas, written out for TINY (h 512, f 2048, s 1024, V 1024, L 8) -----------------------------------

def tiny_layer_params(t: int) -> int:
    """One block's parameters on a tp rank: column-parallel q/k/v and fc1 (weights and biases split), row-parallel
    proj and fc2 (weights split, biases replicated), two LayerNorms (weight + bias, replicated)."""
    h, f = TINY.hidden, TINY.ffn_dim
    return 3 * (h * h // t + h // t) + (h * h // t + h) + (f * h // t + f // t) + (h * f // t + h) + 2 * 2 * h


def tiny_layer_activations(t: int, sp: bool) -> float:
    """Korthikanti per block and micro-batch with selective recompute, bf16 (e = 2), GELU, dropout:
    10 sbh replicated (÷ t with sequence parallel) + (8 sbh + 4 sbf) ÷ t."""
    s, b, h, f = TINY.seq_len, 2, TINY.hidden, TINY.ffn_dim
    return 10 * s * b * h / (t if sp else 1) + (8 * s * b * h + 4 * s * b * f) / t


def test_a_small_pipelined_config_needs_what_the_formulas_say():
    # tp 2 x pp 2 x dp 2, distributed optimizer, sequence parallel, selective recompute, micro_batch 2,
    # global_batch 16 -> m = 16 / (2 x 2) = 4 micro-batches per step; 1F1B: the first stage holds min(pp, m) = 2
    layout = megatron_layout(8, tp=2, pp=2, zero_stage=1, sequence_parallel=True, recompute="selective")
    t, s, b, h, V, L = 2, TINY.seq_len, 2, TINY.hidden, TINY.vocab, TINY.layers
    first_params = L // 2 * tiny_layer_params(t) + V * h // t + s * h             # + word and position embeddings
    last_params = L // 2 * tiny_layer_params(t) + 2 * h + V * h // t              # + final norm + output layer (tied copy)
    first_acts = L // 2 * 2 * tiny_layer_activations(t, True) + 2 * (8 * s * b + s * b * h / t)
    last_acts = L // 2 * 1 * tiny_layer_activations(t, True) + 2 * 2 * s * b * h / t + 4 * s * b * V / t

    def states(n: int) -> int:
        return 2 * n + 4 * n + 12 * math.ceil(n / 2)                               # bf16 + fp32 grads + 12 / dp

    first = stage_memory(TINY, layout, 0, micro_batch=2, m=4)
    last = stage_memory(TINY, layout, 1, micro_batch=2, m=4)
    assert (first.params, last.params) == (first_params, last_params)
    assert first.model_states_bytes == states(first_params) and last.model_states_bytes == states(last_params)
    assert (first.weights_bytes, first.grads_bytes) == (2 * first_params, 4 * first_params)
    assert first.activations_bytes == math.ceil(first_acts) and last.activations_bytes == math.ceil(last_acts)
    assert (first.in_flight, last.in_flight, first.buffers_bytes) == (2, 1, 0)
    most = estimate_megatron_memory(TINY, layout, micro_batch=2, m=4, framework_gib=3.0)
    expected = max((states(first_params) + first_acts, "first"), (states(last_params) + last_acts, "last"))
    assert most.stage == expected[1]
    assert most.total_bytes == math.ceil(expected[0]) + 3 * 1024**3
    # full recompute keeps each block's input (e sbh / t with SP) per micro-batch in flight + one block recomputed
    full = stage_memory(TINY, replace(layout, recompute="full"), 0, micro_batch=2, m=4)
    one_block = tiny_layer_activations(t, True) + 4 * TINY.heads * s * b / t       # + flash attention's fp32 lse
    assert full.activations_bytes == math.ceil(L // 2 * 2 * 2 * s * b * h / t + one_block + 2 * (8 * s * b + s * b * h / t))


def test_the_distributed_optimizer_shards_the_12_bytes_over_dp():
    n = SMALL_6B.total_params()                              # tp 1 x pp 1: the whole model on every rank
    totals = []
    for dp in (2, 4, 8, 16):
        mem = estimate_megatron_memory(SMALL_6B, megatron_layout(dp, zero_stage=1), m=8)
        assert mem.params == n
        assert (mem.weights_bytes, mem.grads_bytes, mem.optimizer_bytes) == (2 * n, 4 * n, 12 * math.ceil(n / dp))
        totals.append(mem.total_bytes)
    assert totals == sorted(totals, reverse=True)
    assert totals[0] - totals[-1] == 12 * (math.ceil(n / 2) - math.ceil(n / 16))   # only the 12 B shrink: 32 GiB here
    ddp = [estimate_megatron_memory(SMALL_6B, megatron_layout(dp, zero_stage=0), m=8) for dp in (2, 16)]
    assert ddp[0].model_states_bytes == ddp[1].model_states_bytes == 18 * n    # no distributed optimizer: 18 B/param
    for stage in (1, 2, 3):                                  # Megatron has one distributed optimizer for 1, 2 and 3
        assert estimate_megatron_memory(SMALL_6B, megatron_layout(8, zero_stage=stage), m=8).optimizer_bytes == 12 * math.ceil(n / 8)
    bf16_reduce = estimate_megatron_memory(SMALL_6B, megatron_layout(8, reduce_dtype="bf16"), m=8)
    assert bf16_reduce.grads_bytes == 2 * n                  # --grad-reduce-in-bf16
    fp32 = estimate_megatron_memory(SMALL_6B, megatron_layout(8, param_dtype="fp32"), m=8)
    assert (fp32.weights_bytes, fp32.grads_bytes, fp32.optimizer_bytes) == (4 * n, 4 * n, 8 * math.ceil(n / 8))


def test_vocabulary_padding_is_megatrons_128_x_tp():
    arch = ArchConfig(layers=2, hidden=64, heads=4, seq_len=128)
    assert [megatron_vocab(arch, "byte", tp) for tp in (1, 2, 3, 4, 8)] == [384, 512, 384, 512, 1024]  # 257 ids, padded
    assert megatron_vocab(arch.model_copy(update={"vocab": 32000}), "byte", 8) == 32000             # --padded-vocab-size


def test_in_flight_micro_batches_and_the_bubble():
    assert [in_flight_chunks(4, 1, 8, r) for r in range(4)] == [4, 3, 2, 1]      # 1F1B: stage r holds pp - r
    assert in_flight_chunks(4, 1, 2, 0) == 2                                     # never more than the step's m
    assert in_flight_chunks(1, 1, 64, 0) == 1                                    # no pipeline: one at a time
    # interleaved: 2(pp - 1) + (vp - 1) pp + 1 chunks of L/(pp vp) blocks = pp (1 + (pp - 1)/(pp vp)) micro-batches
    assert in_flight_chunks(4, 2, 8, 0) / 2 == 4 * (1 + 3 / 8) and in_flight_chunks(4, 2, 8, 3) == 5
    assert pipeline_bubble(4, 1, 8) == 3 / 8 and pipeline_bubble(4, 2, 8) == 3 / 16 and pipeline_bubble(1, 1, 8) == 0


# --- Megatron-LM's own theoretical_memory_usage.py ---------------------------------------------------------------

_CHILD = r'''
import argparse, contextlib, io, json, sys
from megatron.training import theoretical_memory_usage as T
out = []
for case in json.load(sys.stdin):
    m = case.pop("num_microbatches")
    row = {}
    with contextlib.redirect_stdout(io.StringIO()):
        for do in (False, True):
            args = argparse.Namespace(**case, use_distributed_optimizer=do)
            row["weights_do" if do else "weights_18"] = T.compute_weight_and_optimizer_memory(args)
        args = argparse.Namespace(**case, use_distributed_optimizer=True)
        row["act_sp"] = T.compute_activation_memory(args, m)
        row["act_no_sp"] = T.compute_activation_memory_without_sp(args, m)
    out.append(row)
print("@@RESULT@@" + json.dumps(out))
'''

#: h 1024, 16 heads, f 4h, s 2048, V 32768, L 16, LayerNorm, GELU, tied embeddings, dropout (Megatron assumes it)
CROSS = ModelShape(layers=16, hidden=1024, heads=16, seq_len=2048, vocab=32768, ffn_dim=4096, dropout=0.1)
#: (tp, pp, vp, dp, sequence_parallel, micro_batch, m)
CASES = [(1, 1, 1, 4, False, 2, 4), (2, 1, 1, 2, True, 1, 8), (2, 4, 1, 1, False, 1, 8), (1, 4, 2, 2, False, 1, 8),
         (1, 4, 1, 1, False, 2, 2)]


@pytest.fixture(scope="module")
def megatron_theory(tmp_path_factory):
    source = megatron_source(tmp_path_factory.mktemp("megatron-lm"))          # unpacks the tarball
    cases = [dict(kv_channels=CROSS.head_dim, num_attention_heads=CROSS.heads, hidden_size=CROSS.hidden,
                  group_query_attention=False, num_experts=None, swiglu=False, moe_shared_expert_intermediate_size=None,
                  mtp_num_layers=None, normalization="LayerNorm", multi_latent_attention=False,
                  ffn_hidden_size=CROSS.ffn_dim, num_layers=CROSS.layers, padded_vocab_size=CROSS.vocab,
                  untie_embeddings_and_output_weights=False, pipeline_model_parallel_size=pp,
                  tensor_model_parallel_size=tp, data_parallel_size=dp, seq_length=CROSS.seq_len, micro_batch_size=b,
                  virtual_pipeline_model_parallel_size=vp if vp > 1 else None, num_microbatches=m)
             for tp, pp, vp, dp, _sp, b, m in CASES]
    env = {**os.environ, "PYTHONPATH": str(source), "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, "-c", _CHILD], input=json.dumps(cases), capture_output=True, text=True,
                          cwd=source, env=env, timeout=300)
    marker = [line for line in proc.stdout.splitlines() if line.startswith("@@RESULT@@")]
    assert marker, f"theoretical_memory_usage.py did not run: {proc.stderr[-2000:]}"
    return json.loads(marker[-1].removeprefix("@@RESULT@@"))


def ours(case) -> tuple:
    tp, pp, vp, dp, sp, b, m = case
    layout = megatron_layout(tp * pp * dp, tp=tp, pp=pp, zero_stage=1, sequence_parallel=sp, recompute="selective")
    return layout, stage_memory(CROSS, layout, 0, micro_batch=b, m=m, virtual_stages=vp)


def test_weights_and_optimizer_match_megatrons_formula(megatron_theory):
    h, f, s, L = CROSS.hidden, CROSS.ffn_dim, CROSS.seq_len, CROSS.layers
    for case, theirs in zip(CASES, megatron_theory):
        tp, pp, vp, dp, *_ = case
        _layout, first = ours(case)
        megatron_params = theirs["weights_18"] / 18                   # their parameter count on the most loaded shard
        assert theirs["weights_do"] == pytest.approx(megatron_params * (6 + 12 / dp))
        per_param = first.model_states_bytes / first.params             # 2 + 4 + 12/dp, up to the ceil of the shard
        assert per_param == pytest.approx(6 + 12 / dp, rel=1e-8)
        # Megatron's count leaves out the biases (column-parallel q/k/v 3h and fc1 f split over tp, row-parallel
        # proj and fc2 h each replicated) and the learned positions (s h, on the first stage), and divides the
        # replicated LayerNorms (4h per block) by tp and the final norm (2h, on the last stage) by pp x tp
        per_block = (3 * h + f) / tp + 2 * h + 4 * h * (1 - 1 / tp)
        missing = L / pp * per_block + s * h + (2 * h if pp == 1 else 0) - 2 * h / (pp * tp)
        assert first.params == pytest.approx(megatron_params + missing, abs=1e-3)
        assert first.model_states_bytes == pytest.approx(theirs["weights_do"] / megatron_params * first.params, rel=1e-8)


def test_first_stage_activations_match_megatrons_formula(megatron_theory):
    for case, theirs in zip(CASES, megatron_theory):
        tp, pp, vp, dp, sp, b, m = case
        _layout, first = ours(case)
        token_ids = 8 * CROSS.seq_len * b * first.in_flight            # replicated over tp; Megatron divides them by tp
        if sp or tp == 1:       # compute_activation_memory: sequence parallel (with tp 1 the same thing)
            assert first.activations_bytes == pytest.approx(theirs["act_sp"] + token_ids * (1 - 1 / tp), abs=1)
        if not sp and pp > 1:   # compute_activation_memory_without_sp, less its 5% allowance (no output layer here)
            assert first.activations_bytes == pytest.approx(theirs["act_no_sp"] / 1.05, abs=1)
        assert first.in_flight == (in_flight_chunks(pp, vp, m, 0) / vp)


# --- the planner -------------------------------------------------------------------------------------------------

def test_a_megatron_model_plans_with_pipeline_stages_and_the_builtin_trainer_with_its_own_rules():
    par = ParallelismConfig(zero_stage=1, pp=4, virtual_stages=2)
    ev = evaluate(spec(par), H200, 88)
    assert ev.ok, ev.reasons
    assert (ev.layout.dp, ev.layout.pp, ev.microbatches) == (22, 4, 56)           # 1232 / (1 x 22)
    assert ev.bubble == pytest.approx(3 / (2 * 56))
    flat = evaluate(spec(ParallelismConfig(zero_stage=1)), H200, 88)
    assert flat.bubble == 0 and ev.step_seconds == pytest.approx(flat.step_seconds * (1 + 3 / 112))
    assert ev.memory.stage == "first" and ev.memory.in_flight == 4 * (1 + 3 / 8)
    refused = evaluate(spec(par, framework=BUILTIN), H200, 88)
    assert not any(r.startswith("models[0].parallelism.pp") for r in refused.reasons)  # the built-in trainer pipelines
    assert [r.split(":")[0] for r in refused.reasons] == ["models[0].parallelism.zero_stage", "models[0].model.tie_embeddings"]
    assert refused.reasons[0].startswith("models[0].parallelism.zero_stage: zero_stage 1 is not implemented")
    assert refused.memory is None
    odd = evaluate(spec(ParallelismConfig(zero_stage=1, pp=3)), H200, 96)
    assert odd.reasons[0].startswith("models[0].parallelism.pp: pp=3 does not divide model.layers=32")


def test_the_memory_hint_offers_megatrons_settings():
    ev = evaluate(spec(ParallelismConfig(zero_stage=0), shape=LARGE_12B), H100, 112)
    reason = ev.reasons[0]
    assert reason.startswith("does not fit: needs ") and "(tp 1 x pp 1 x dp 112, no distributed optimizer, bf16)" in reason
    # each setting alone, named only when it fits on these 112 H100s: the smallest tp and pp that do
    assert reason.endswith("try parallelism.tp: 4 with sequence_parallel: true, parallelism.pp: 8")
    for par, fits in ((ParallelismConfig(zero_stage=0, tp=4, sequence_parallel=True), True),
                      (ParallelismConfig(zero_stage=0, tp=2, sequence_parallel=True), False),
                      (ParallelismConfig(zero_stage=0, pp=8), True), (ParallelismConfig(zero_stage=0, pp=4), False),
                      (ParallelismConfig(zero_stage=0, recompute="selective"), False)):
        assert evaluate(spec(par, shape=LARGE_12B), H100, 112).ok is fits, par
    sharded = evaluate(spec(ParallelismConfig(zero_stage=1), shape=LARGE_12B), H100, 112)
    assert sharded.memory.total_bytes < ev.memory.total_bytes - 100 * 1024**3      # 12 of 18 B/param sharded over 112
    assert not sharded.ok and "zero_stage: 1" not in reason                        # ... and still too much for an H100
    assert evaluate(spec(ParallelismConfig(zero_stage=1), shape=LARGE_12B), H200, 112).ok
    h200 = evaluate(spec(ParallelismConfig(zero_stage=0), shape=LARGE_12B), H200, 112).reasons[0]
    assert h200.endswith("; try parallelism.zero_stage: 1 (the distributed optimizer), parallelism.tp: 2 with "
                         "sequence_parallel: true, parallelism.pp: 4"), h200        # an H200 holds more: zero_stage 1 fits


def test_a_megatron_model_that_never_fits_is_an_error_on_its_parallelism():
    project = load_project(P5E, ["models.model-7.framework=megatron", "models.model-7.parallelism.zero_stage=0"])
    plan = make_plan(project)
    seven = plan.model("model-7")
    assert not seven.feasible and seven.nodes is None              # 18 B x 13.9B parameters on every GPU
    assert "│ model-7 │ megatron  │ 13.85B │ 460.0B │ -     │ -    │ tp 1 x pp 1 x dp ? │" in render_plan(plan, "table")
    errors = [f for f in plan_findings(project) if f.level == "error"]
    assert [f.path for f in errors] == ["models[6].parallelism"]
    assert "model-7 is infeasible (megatron framework): does not fit: needs 267.7 GiB per GPU" in errors[0].message
    # from first principles: 2 + 4 + 12 B per parameter on every rank, the built-in trainer's activations (the same
    # Korthikanti count) plus the token ids Megatron keeps (8 s b), and the framework's 3 GiB
    builtin = make_plan(load_project(P5E)).model("model-7")
    needs = (18 * seven.params + builtin.memory["activations"] + 8 * 4096) / 1024**3 + 3
    assert needs == pytest.approx(267.7, abs=0.05)
    assert "try parallelism.zero_stage: 1 (the distributed optimizer)" in errors[0].message


def test_the_flagship_with_model_1_on_megatron():
    builtin = make_plan(load_project(P5E))
    project = load_project(P5E, MEGATRON_MODEL_1)
    plan = make_plan(project)
    assert plan.feasible
    one, two = plan.model("model-1"), plan.model("model-2")
    assert (one.framework, two.framework) == ("megatron", "builtin")
    assert one.memory["total"] != two.memory["total"]
    # tp 1 x pp 1 x dp 88 with the distributed optimizer: every parameter on every rank, 2 + 4 + 12/88 bytes each
    n = one.params
    assert one.memory["params"] == n == builtin.model("model-1").params
    assert (one.memory["weights"], one.memory["grads"], one.memory["optimizer"]) == (2 * n, 4 * n, 12 * math.ceil(n / 88))
    assert one.memory["buffers"] == 0
    # same Korthikanti activations as the built-in trainer's (no dropout, flash), plus the token ids Megatron keeps
    assert one.memory["activations"] == two.memory["activations"] + 8 * 4096
    assert one.layout_text == "tp 1 x pp 1 x dp 88, distributed optimizer, bf16"
    assert (one.microbatches, one.pipeline_bubble, one.memory_stage) == (14, 0.0, "first")
    assert one.step_time_s == pytest.approx(two.step_time_s)          # same FLOPs, no bubble at pp 1
    for name in ("model-2", "model-7"):                                # the built-in models' figures do not move
        assert plan.model(name).memory == builtin.model(name).memory
        assert plan.model(name).step_time_s == builtin.model(name).step_time_s
        assert plan.model(name).nodes == builtin.model(name).nodes
    table = render_plan(plan, "table")
    assert "┃ model   ┃ framework ┃" in table and "│ model-1 │ megatron  │" in table and "│ model-2 │ builtin   │" in table
    assert "model-1 (megatron): 6.54s per step at 40% MFU; no pipeline bubble (pp 1)" in table
    assert "memory per GPU (the most loaded rank)" in table
    doc = json.loads(render_plan(plan, "json"))
    assert doc["models"][0]["layout"]["virtual_stages"] == 1 and doc["models"][1]["pipeline_bubble"] is None
    assert "| model | framework | params |" in render_plan(plan, "markdown")
    assert "framework" not in render_plan(builtin, "markdown").split("\n\n")[2].splitlines()[0]  # built-in only: no column
    assert not [f for f in submit_blockers(project, ["model-1"]) if f.path.startswith("models[0]")]


def test_the_flagship_model_1_pipelined_on_megatron_and_on_the_builtin_trainer_only_untied():
    pipelined = MEGATRON_MODEL_1 + ["models.model-1.parallelism.pp=4", "models.model-1.parallelism.virtual_stages=2",
                                    "models.model-1.parallelism.tp=2", "models.model-1.parallelism.sequence_parallel=true",
                                    "models.model-1.parallelism.recompute=selective"]
    project = load_project(P5E, pipelined)
    plan = make_plan(project)
    one = plan.model("model-1")
    assert one.feasible and one.nodes == 11
    assert one.layout_text == ("tp 2 x pp 4 (vp 2) x dp 11, distributed optimizer, sequence parallel, recompute selective, "
                               "bf16, most loaded: first stage, 5.5 micro-batches in flight")
    assert one.microbatches == 112 and one.pipeline_bubble == pytest.approx(3 / 224)
    assert one.step_time_s == pytest.approx(plan.model("model-2").step_time_s * (1 + 3 / 224))
    assert "pipeline bubble (pp 4 - 1) / (vp 2 x 112 micro-batches) = 1.3%" in render_plan(plan, "table")
    assert not [f for f in submit_blockers(project) if f.path.startswith("models[0]")]
    # the built-in trainer pipelines too, but its stages cannot share a tied embedding and output layer: the
    # flagship's Llama-family models are untied, so pp=4 plans as it is, and tying them is refused
    with pytest.raises(ConfigError, match=r"models\[0\]\.model\.tie_embeddings: true with pp=4: the embedding sits on the "
                                          r"first pipeline stage and the output layer on the last"):
        load_project(P5E, ["models.model-1.parallelism.pp=4", "models.model-1.model.tie_embeddings=true"])
    builtin = make_plan(load_project(P5E, ["models.model-1.parallelism.pp=4"]))
    assert builtin.model("model-1").feasible and builtin.model("model-1").layout["pp"] == 4


def test_megatron_without_transformer_engine_keeps_the_attention_scores():
    te = make_plan(load_project(P5E, MEGATRON_MODEL_1)).model("model-1")
    local = make_plan(load_project(P5E, MEGATRON_MODEL_1 + ["models.model-1.megatron.transformer_impl=local"])).model("model-1")
    s, a, L, h, kv = 4096, 32, 32, 4096, 8 * 128
    # unfused DotProductAttention: softmax output e·a·s² per block instead of flash attention's fp32 lse 4·a·s (no
    # dropout), and K and V saved after repeat_interleave to all 32 query heads, h wide instead of GQA's 8 x 128
    # (megatron/core/transformer/dot_product_attention.py at core_v0.16.1)
    assert local.memory["activations"] - te.memory["activations"] == L * (2 * a * s * s - 4 * a * s) + L * 2 * 2 * s * (h - kv)
