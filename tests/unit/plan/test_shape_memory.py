"""The planner's view of the trainer's model and its memory: the tensor list against the real GPT, the
model-state bytes against the real tensors after an optimizer step, the FSDP2/TP shard arithmetic
against torch's own chunking and by hand, and the activation formulas against Korthikanti et al. 2022."""

from __future__ import annotations

import pytest
import torch

from clustertrain.plan.memory import (
    GiB,
    buffer_bytes,
    chunk_rows,
    estimate_memory,
    layer_activation_bytes,
    local_shape,
    trainer_state_bytes,
)
from clustertrain.core.model_shape import ModelShape, parameter_tensors
from clustertrain.train.config import ArchConfig, TrainingConfig
from clustertrain.core.parallel_layout import ParallelLayout
from clustertrain.train.model import GPT, loss_fn
from clustertrain.train.optim import build_optimizer

ARCHS = [
    dict(layers=2, hidden=64, heads=4, seq_len=32),
    dict(layers=3, hidden=96, heads=6, seq_len=16, mlp="swiglu", norm="rmsnorm", tie_embeddings=False),
    dict(layers=1, hidden=128, heads=8, seq_len=64, ffn_hidden=200, norm="rmsnorm"),
    # Llama-style: rotary positions (no pos_emb), grouped-query attention, no linear biases, untied, RMSNorm, SwiGLU
    dict(layers=2, hidden=64, heads=4, kv_heads=2, seq_len=32, position="rope", bias=False, mlp="swiglu",
         norm="rmsnorm", norm_eps=1e-6, tie_embeddings=False),
    dict(layers=1, hidden=96, heads=6, kv_heads=1, seq_len=16, position="rope", mlp="swiglu", norm="rmsnorm"),  # MQA, biases
]


def fsdp(dp: int, tp: int = 1, **kw) -> ParallelLayout:
    return ParallelLayout(world=dp * tp, dp=dp, tp=tp, zero_stage=3, **kw)


@pytest.mark.parametrize("kw", ARCHS)
def test_parameter_tensors_are_the_trainer_models_names_and_shapes(kw):
    arch = ArchConfig(**kw)
    model = GPT(arch, 320)
    shape = ModelShape.from_arch(arch, 320)
    real = {name: tuple(p.shape) for name, p in model.named_parameters()}
    assert {t.name: t.shape for t in parameter_tensors(shape)} == real
    assert shape.param_tensors() == len(real) == len(parameter_tensors(shape))
    assert shape.total_params() == model.num_params()
    assert shape.non_embedding_params() == model.num_params(non_embedding=True)


@pytest.mark.parametrize("kw", ARCHS)
def test_model_state_bytes_equal_the_real_tensors_after_one_optimizer_step(kw):
    arch = ArchConfig(**kw)
    model = GPT(arch, 320, seed=0)
    opt = build_optimizer(model, TrainingConfig(max_steps=1))
    x = torch.randint(0, 320, (2, arch.seq_len))
    loss_fn(model(x), x).backward()
    opt.step()
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters())
    state = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values() if torch.is_tensor(t))
    assert all(set(s) == {"step", "exp_avg", "exp_avg_sq"} for s in opt.state.values())
    layout = ParallelLayout(world=1, dp=1, param_dtype="fp32")
    assert trainer_state_bytes(ModelShape.from_arch(arch, 320), layout) == (params, grads, state)


@pytest.mark.parametrize("rows,parts", [(8, 3), (4, 3), (10, 4), (7, 8), (64, 4), (1, 2), (33, 5)])
def test_chunk_rows_is_torch_chunk(rows, parts):
    sizes = [c.shape[0] for c in torch.chunk(torch.empty(rows), parts)]
    sizes += [0] * (parts - len(sizes))                         # torch returns fewer chunks: those ranks hold nothing
    assert [chunk_rows(rows, parts, i) for i in range(parts)] == sizes


TINY = ModelShape(layers=1, hidden=8, heads=2, seq_len=4, vocab=16, ffn_dim=32)


def test_fsdp_times_tp_shards_by_hand():
    """tp 2 x dp 3 on a one-block GPT (h 8, f 32, s 4, V 16, LayerNorm, tied): rank 0 holds ceil rows."""
    layout = fsdp(dp=3, tp=2)
    # tok_emb [16,8] -> tp [8,8] -> 3 rows 24 | pos [4,8] -> 2 rows 16 | norms 3 x 2 x 3 = 18
    # wq/wk/wv [8,8] -> [4,8] -> 2 rows 16 each, biases [8] -> [4] -> 2 each | wo [8,8] -> [8,4] -> 3 rows 12, bias 3
    # w_up [32,8] -> [16,8] -> 6 rows 48, bias 6 | w_down [8,32] -> [8,16] -> 3 rows 48, bias 3
    local = 24 + 16 + 18 + 3 * 16 + 3 * 2 + 12 + 3 + 48 + 6 + 48 + 3
    assert local == 232 and len(parameter_tensors(TINY)) == 20
    assert trainer_state_bytes(TINY, layout) == (4 * 232, 4 * 232, 8 * 232 + 4 * 20)
    # the last rank (dp 2, tp 1) gets what is left: pos_emb and the q/k/v shards are empty there
    last = {t.name: local_shape(t, layout, rank=5) for t in parameter_tensors(TINY)}
    assert last["pos_emb.weight"] == (0, 8) and last["blocks.0.attn.wq.weight"] == (0, 8)
    assert trainer_state_bytes(TINY, layout, rank=5)[0] == 4 * 108


LLAMA = ModelShape(layers=3, hidden=96, heads=6, seq_len=16, vocab=320, ffn_dim=256, mlp="swiglu", norm="rmsnorm",
                   tie_embeddings=False, kv_heads=2, position="rope", bias=False)


@pytest.mark.parametrize("shape", [TINY, ModelShape(layers=3, hidden=96, heads=6, seq_len=16, vocab=320, ffn_dim=256,
                                                    mlp="swiglu", norm="rmsnorm", tie_embeddings=False), LLAMA])
@pytest.mark.parametrize("dp", [2, 3, 4, 5])
def test_fsdp_shards_partition_the_model_and_rank_0_is_the_most_loaded(shape, dp):
    ddp = trainer_state_bytes(shape, ParallelLayout(world=1, dp=1))
    ranks = [trainer_state_bytes(shape, fsdp(dp), rank=r) for r in range(dp)]
    assert sum(r[0] for r in ranks) == ddp[0] and sum(r[1] for r in ranks) == ddp[1]   # every element exactly once
    steps = 4 * shape.param_tensors()
    assert sum(r[2] - steps for r in ranks) == ddp[2] - steps                           # AdamW step: per tensor per rank
    assert ranks[0] == max(ranks)
    expect = sum(-(-t.shape[0] // dp) * (t.numel // t.shape[0]) for t in parameter_tensors(shape))
    assert ranks[0][0] == 4 * expect                                                    # ceil(rows / dp) rows per tensor


def test_tp_2_gives_each_rank_whole_key_value_heads():
    """GQA: wk/wv are [kv_heads x head_dim, h]; tp 2 over kv_heads 2 leaves each rank one head (head_dim rows)."""
    shape = ModelShape(layers=1, hidden=64, heads=4, seq_len=32, vocab=320, ffn_dim=128, kv_heads=2, position="rope",
                       bias=False, norm="rmsnorm", mlp="swiglu")
    tp2 = ParallelLayout(world=2, dp=1, tp=2, zero_stage=3)
    tensors = {t.name: t for t in parameter_tensors(shape)}
    assert "pos_emb.weight" not in tensors and not any(n.endswith(".bias") for n in tensors)
    for rank in (0, 1):
        assert local_shape(tensors["blocks.0.attn.wk.weight"], tp2, rank) == (16, 64)   # one kv head of 16
        assert local_shape(tensors["blocks.0.attn.wq.weight"], tp2, rank) == (32, 64)   # two query heads
    # per rank: tok_emb 160x64 + wq 32x64 + wk, wv 16x64 + wo 64x32 + gate, up 64x64 + down 64x64 + norms 3 x 64
    local = 160 * 64 + 32 * 64 + 2 * 16 * 64 + 64 * 32 + 2 * 64 * 64 + 64 * 64 + 3 * 64
    assert trainer_state_bytes(shape, tp2)[0] == 4 * local


@pytest.mark.parametrize("gqa", [False, True])
def test_tp_2_halves_the_split_tensors_and_keeps_the_replicated_ones(gqa):
    shape = ModelShape(layers=2, hidden=64, heads=4, seq_len=32, vocab=320, ffn_dim=256, tie_embeddings=False,
                       **(dict(kv_heads=2, position="rope", bias=False) if gqa else {}))
    tp2 = ParallelLayout(world=2, dp=1, tp=2, zero_stage=3)
    one = ParallelLayout(world=1, dp=1)
    split = replicated = 0
    for t in parameter_tensors(shape):
        full, half = local_shape(t, one), local_shape(t, tp2)
        if t.tp_dim is None:
            assert half == full
            replicated += t.numel
        else:
            assert half[t.tp_dim] * 2 == full[t.tp_dim] and t.numel == 2 * _numel(half)
            split += t.numel
    assert trainer_state_bytes(shape, tp2)[0] == 4 * (split // 2 + replicated)
    # both tp ranks hold the same amount; FSDP over dp 2 on top halves again (all dims divide)
    assert trainer_state_bytes(shape, tp2, rank=1) == trainer_state_bytes(shape, tp2)
    assert trainer_state_bytes(shape, fsdp(dp=2, tp=2))[0] * 2 == trainer_state_bytes(shape, tp2)[0]


def _numel(dims) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def test_buffers_are_the_stated_allowances():
    shape = ModelShape(layers=4, hidden=64, heads=4, seq_len=32, vocab=320, ffn_dim=256)
    params = shape.total_params()
    assert buffer_bytes(shape, ParallelLayout(world=1, dp=1, param_dtype="fp32")) == 0
    assert buffer_bytes(shape, ParallelLayout(world=2, dp=2, param_dtype="fp32")) == 4 * params      # DDP buckets
    assert buffer_bytes(shape, ParallelLayout(world=2, dp=2, param_dtype="bf16")) == 6 * params      # + autocast copy
    block = sum(t.numel for t in parameter_tensors(shape) if t.block == 0)
    root = sum(t.numel for t in parameter_tensors(shape) if t.block is None)
    assert buffer_bytes(shape, fsdp(4, param_dtype="bf16")) == 2 * (root + 2 * block) + 4 * block
    assert buffer_bytes(shape, fsdp(4, param_dtype="bf16", reshard_after_forward=False)) == 2 * (root + 4 * block) + 4 * block
    assert buffer_bytes(shape, fsdp(4, param_dtype="fp32", reduce_dtype="bf16")) == 4 * (root + 2 * block) + 2 * block
    # one process: no mesh, so no FSDP2 (clustertrain.train.parallel) — zero_stage 3 runs as DDP 1 under autocast
    assert buffer_bytes(shape, fsdp(1, param_dtype="bf16")) == 2 * params
    assert buffer_bytes(shape, fsdp(1, param_dtype="bf16")) == buffer_bytes(shape, ParallelLayout(world=1, dp=1, param_dtype="bf16"))


FLAGSHIP_6B = ModelShape(layers=32, hidden=4096, heads=32, seq_len=4096, vocab=32000, ffn_dim=16384)
FLAGSHIP_12B = ModelShape(layers=40, hidden=5120, heads=40, seq_len=4096, vocab=32000, ffn_dim=20480)


def test_flagship_needs_155_and_290_gib_under_ddp_and_little_under_fsdp2():
    ddp6 = estimate_memory(FLAGSHIP_6B, ParallelLayout(world=88, dp=88, param_dtype="bf16"), framework_gib=3.0)
    ddp12 = estimate_memory(FLAGSHIP_12B, ParallelLayout(world=112, dp=112, param_dtype="bf16"), framework_gib=3.0)
    assert round(ddp6.total_bytes / GiB) == 155 and round(ddp12.total_bytes / GiB) == 290
    assert ddp6.model_states_bytes == 16 * FLAGSHIP_6B.total_params() + 4 * FLAGSHIP_6B.param_tensors()
    f6 = estimate_memory(FLAGSHIP_6B, fsdp(88, param_dtype="bf16"), framework_gib=3.0)
    f12 = estimate_memory(FLAGSHIP_12B, fsdp(112, param_dtype="bf16"), framework_gib=3.0)
    assert f6.model_states_bytes < 1.2 * GiB and f12.model_states_bytes < 2 * GiB   # 16 B/param over 88 and 112 ranks
    assert f6.total_bytes < 25 * GiB and f12.total_bytes < 35 * GiB                   # activations are the bulk
    tp = estimate_memory(FLAGSHIP_12B, fsdp(56, tp=2, param_dtype="bf16", sequence_parallel=True), framework_gib=3.0)
    assert tp.activations_bytes == pytest.approx(f12.activations_bytes / 2, rel=0.01) and tp.total_bytes < f12.total_bytes


def _korthikanti_shape(**kw) -> ModelShape:
    # GELU with f = 4h and dropout > 0: the block the paper's 34·s·b·h + 5·a·s²·b describes
    return ModelShape(layers=4, hidden=1024, heads=16, seq_len=2048, vocab=50304, ffn_dim=4096, dropout=0.1, **kw)


def test_activations_per_layer_match_korthikanti_table_2():
    sh = _korthikanti_shape()
    s, b, h, a, t = 2048, 2, 1024, 16, 8
    sbh, as2b = s * b * h, a * s * s * b

    def per_layer(**kw):
        tp = kw.pop("tp", 1)
        return layer_activation_bytes(sh, ParallelLayout(world=tp, dp=1, tp=tp, zero_stage=3, param_dtype=kw.pop("dtype", "bf16"),
                                                         **kw), micro_batch=b, flash_attention=False)

    assert per_layer() == 34 * sbh + 5 * as2b
    assert per_layer(tp=t) == sbh * (10 + 24 / t) + 5 * as2b / t
    assert per_layer(tp=t, sequence_parallel=True) == 34 * sbh / t + 5 * as2b / t
    assert per_layer(tp=t, sequence_parallel=True, recompute="selective") == 34 * sbh / t
    assert per_layer(tp=t, recompute="full") == 2 * sbh
    # fp32 doubles every element but not the 1-byte dropout masks
    assert per_layer(dtype="fp32") == (16 + 2 + 16 + 32) * sbh + (4 + 1 + 4) * as2b


def test_flash_attention_keeps_only_the_log_sum_exp():
    sh = _korthikanti_shape()
    s, b, h, a = 2048, 1, 1024, 16
    layout = ParallelLayout(world=1, dp=1, param_dtype="bf16")
    assert layer_activation_bytes(sh, layout, micro_batch=b) == 34 * s * b * h + 4 * a * s * b


def _saved_bytes(block, x) -> int:
    """Bytes autograd saves for backward in ``block(x)`` (activations: not the parameters), each storage once."""
    params = {p.untyped_storage().data_ptr() for p in block.parameters()}
    storages: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            storages[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x)
    return sum(storages.values())


@pytest.mark.parametrize("flash", [True, False], ids=["flash", "math"])
@pytest.mark.parametrize("kw", [ARCHS[0], ARCHS[3], dict(ARCHS[3], kv_heads=4, position="learned", bias=True)],
                         ids=["gpt", "llama-gqa", "llama-mha-learned"])
def test_block_activations_are_what_autograd_saves(kw, flash):
    """layer_activation_bytes against the tensors autograd really saves in one block's forward (fp32, CPU): K and V
    are kv_heads wide under flash attention and repeated to every query head by the math kernel; rotary positions add
    only their cos/sin tables. What the formula leaves out, stated: the norms' fp32 statistics, the rope tables, and
    — the CPU build's RMSNorm being a decomposition — its normalised copy (CUDA's fused kernel keeps only the input)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from clustertrain.train.model import Block

    arch, b = ArchConfig(**kw), 2
    torch.manual_seed(0)
    block = Block(arch)
    x = torch.randn(b, arch.seq_len, arch.hidden, requires_grad=True)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION if flash else SDPBackend.MATH):
        saved = _saved_bytes(block, x)
    shape = ModelShape.from_arch(arch, 320)
    sb = arch.seq_len * b
    stats = 2 * (8 * sb if arch.norm == "layernorm" else 4 * sb)
    rope = 2 * 4 * arch.seq_len * arch.head_dim if arch.position == "rope" else 0
    cpu_rmsnorm = 2 * 4 * sb * arch.hidden if arch.norm == "rmsnorm" else 0
    planned = layer_activation_bytes(shape, ParallelLayout(world=1, dp=1, param_dtype="fp32"), micro_batch=b,
                                     flash_attention=flash)
    assert saved == planned + stats + rope + cpu_rmsnorm
    if shape.kv_head_count < shape.heads and flash:   # fewer key/value heads save less than multi-head attention would
        mha = layer_activation_bytes(ModelShape.from_arch(arch.model_copy(update={"kv_heads": None}), 320),
                                     ParallelLayout(world=1, dp=1, param_dtype="fp32"), micro_batch=b)
        assert planned == mha - 2 * 4 * sb * (arch.hidden - shape.kv_dim)


@pytest.mark.parametrize("kw", ARCHS)
def test_calibration_times_the_optimizer_over_the_models_own_parameters(kw):
    """plan.calibrate times AdamW and clipping over tensors of these sizes: the model's, element for element."""
    from clustertrain.plan.calibrate import _param_sizes

    shape = ModelShape.from_arch(ArchConfig(**kw), 320)
    assert sum(_param_sizes(shape)) == shape.total_params()
