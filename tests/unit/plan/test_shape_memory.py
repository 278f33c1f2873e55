"""Parameter counts and the memory formulas — against the real trainer's tensors and against
hand-computed cases (Korthikanti et al. 2022 Table 2; a 7B GPT with TP 8, ZeRO-1 over 64 GPUs)."""

from __future__ import annotations

import pytest
import torch

from clustertrain.plan.memory import Layout, estimate_memory, layer_activation_bytes, stage_params, structure_problems
from clustertrain.plan.shape import ModelShape
from clustertrain.train.config import ArchConfig, TrainingConfig
from clustertrain.train.model import GPT
from clustertrain.train.optim import build_optimizer

ARCHS = [
    dict(layers=2, hidden=64, heads=4, seq_len=32),
    dict(layers=3, hidden=96, heads=6, seq_len=16, mlp="swiglu", norm="rmsnorm", tie_embeddings=False),
    dict(layers=1, hidden=128, heads=8, seq_len=64, ffn_hidden=200, norm="rmsnorm"),
]


@pytest.mark.parametrize("kw", ARCHS)
def test_param_counts_match_the_trainer_model(kw):
    arch = ArchConfig(**kw)
    model = GPT(arch, 320)
    shape = ModelShape.from_arch(arch, 320)
    assert shape.total_params() == model.num_params()
    assert shape.non_embedding_params() == model.num_params(non_embedding=True)
    assert shape.param_tensors() == len(list(model.parameters()))


@pytest.mark.parametrize("kw", ARCHS)
def test_model_state_bytes_equal_the_real_tensors_after_one_optimizer_step(kw):
    arch = ArchConfig(**kw)
    torch.manual_seed(0)
    model = GPT(arch, 320)
    opt = build_optimizer(model, TrainingConfig(max_steps=1))
    x = torch.randint(0, 320, (2, arch.seq_len))
    model(x, x).backward()
    opt.step()
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters())
    state = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values() if torch.is_tensor(t))
    assert all(set(s) == {"step", "exp_avg", "exp_avg_sq"} for s in opt.state.values())
    est = estimate_memory(ModelShape.from_arch(arch, 320), Layout(precision="fp32", dp=1))
    assert (est.weights_bytes, est.grads_bytes, est.optimizer_bytes) == (params, grads, state)


def _korthikanti_shape(**kw) -> ModelShape:
    # GELU with f = 4h and dropout > 0: the block the paper's 34·s·b·h + 5·a·s²·b describes
    return ModelShape(layers=4, hidden=1024, heads=16, seq_len=2048, vocab=50304, ffn_dim=4096, dropout=0.1, **kw)


def test_activations_per_layer_match_korthikanti_table_2():
    sh = _korthikanti_shape()
    s, b, h, a, t = 2048, 2, 1024, 16, 8
    sbh, as2b = s * b * h, a * s * s * b
    base = dict(micro_batch=b, flash_attention=False, precision="bf16")
    assert layer_activation_bytes(sh, Layout(**base)) == 34 * sbh + 5 * as2b
    assert layer_activation_bytes(sh, Layout(tp=t, **base)) == sbh * (10 + 24 / t) + 5 * as2b / t
    assert layer_activation_bytes(sh, Layout(tp=t, sequence_parallel=True, **base)) == 34 * sbh / t + 5 * as2b / t
    assert layer_activation_bytes(sh, Layout(tp=t, sequence_parallel=True, recompute="selective", **base)) == 34 * sbh / t
    assert layer_activation_bytes(sh, Layout(tp=t, recompute="full", **base)) == 2 * sbh
    # fp32 doubles every element but not the 1-byte dropout masks: (34 - 2 - ... ) computed by hand
    fp32 = layer_activation_bytes(sh, Layout(micro_batch=b, flash_attention=False, precision="fp32"))
    assert fp32 == (16 + 2 + 16 + 32) * sbh + (4 + 1 + 4) * as2b


def test_flash_attention_keeps_only_the_log_sum_exp():
    sh = _korthikanti_shape()
    s, b, h, a = 2048, 1, 1024, 16
    assert layer_activation_bytes(sh, Layout(micro_batch=b)) == 34 * s * b * h + 4 * a * s * b


SEVEN_B = ModelShape(layers=32, hidden=4096, heads=32, seq_len=4096, vocab=32000, ffn_dim=16384)


def test_7b_tp8_pp1_zero1_over_64_gpus_by_hand():
    # per block: tensor-parallel part 4h² + 2fh + 3h + f = 201,355,264 / 8 = 25,169,408,
    # plus replicated row biases 2h = 8,192 and two LayerNorms 4h = 16,384 -> 25,193,984
    # 32 blocks 806,207,488 + vocab shard 4,000 x 4096 = 16,384,000 + positions 16,777,216 + final norm 8,192
    assert stage_params(SEVEN_B, tp=8, pp=1, stage=0) == (839_376_896, 32 * 12 + 4)
    layout = Layout(tp=8, pp=1, dp=8, micro_batch=1, grad_accum=16, zero_stage=1, precision="bf16")
    est = estimate_memory(SEVEN_B, layout, framework_gib=3.0)
    assert est.weights_bytes == 2 * 839_376_896
    assert est.grads_bytes == 2 * 839_376_896
    assert est.optimizer_bytes == 12 * 839_376_896 // 8 + 4 * 388          # fp32 master + moments over dp = 8
    # activations: 32 x (8·sbh + (8·sbh + 4·sbf)/8 + 4·a·s/8) + output 4·sbh + 4·s·4000
    assert est.activations_bytes == 32 * (134_217_728 + 50_331_648 + 65_536) + 67_108_864 + 65_536_000
    assert est.buffers_bytes == 0
    assert est.total_bytes == 2 * 1_678_753_792 + 1_259_066_896 + 6_040_322_048 + 3 * 1024**3


def test_zero_stages_shard_progressively_and_ddp_buckets_count():
    base = dict(tp=8, dp=8, micro_batch=1, precision="bf16")
    z = [estimate_memory(SEVEN_B, Layout(zero_stage=k, **base)) for k in range(4)]
    assert z[0].optimizer_bytes > z[1].optimizer_bytes and z[1].grads_bytes > z[2].grads_bytes
    assert z[2].weights_bytes > z[3].weights_bytes
    assert z[0].buffers_bytes == z[0].grads_bytes        # DDP copies gradients into buckets
    assert z[3].buffers_bytes > 0                          # two blocks gathered for FSDP


def test_pipeline_puts_embedding_on_first_and_a_tied_copy_on_last_stage():
    first = stage_params(SEVEN_B, 1, 4, 0)[0]
    last = stage_params(SEVEN_B, 1, 4, 3)[0]
    middle = stage_params(SEVEN_B, 1, 4, 1)[0]
    assert first - middle == 32000 * 4096 + 4096 * 4096
    assert last - middle == 32000 * 4096 + 2 * 4096


def test_structure_problems_name_the_valid_choices():
    sh = ModelShape(layers=30, hidden=768, heads=12, seq_len=1024, vocab=50304, ffn_dim=3072)
    assert structure_problems(sh, 8, 1) == ["tp=8 does not divide heads=12; valid tp: 1, 2, 3, 4, 6, 12"]
    assert structure_problems(sh, 4, 4) == ["pp=4 does not divide layers=30; valid pp: 1, 2, 3, 5, 6, 10, 15, 30"]
    assert structure_problems(sh, 4, 5) == []
