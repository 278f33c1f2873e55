import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from clustertrain.train.config import ArchConfig, TrainingConfig
from clustertrain.train.model import GPT, apply_rope, flops_per_token, loss_fn, padded_vocab, rope_tables
from clustertrain.train.optim import build_optimizer, lr_at


def test_gpt_shapes_params_and_tied_embeddings():
    arch = ArchConfig(layers=2, hidden=32, heads=4, seq_len=16)
    model = GPT(arch, padded_vocab(arch, 258))
    assert model.vocab == 320
    x = torch.randint(0, 258, (3, 16))
    assert model(x).shape == (3, 16, 320)
    loss = loss_fn(model(x), x)
    assert 5.0 < loss.item() < 7.0  # ~ln(320) at init
    assert model.head.weight is model.tok_emb.weight
    per_layer = 2 * 32 + 3 * (32 * 32 + 32) + (32 * 32 + 32) + 2 * 32 + (32 * 128 + 128) + (128 * 32 + 32)
    assert model.num_params(non_embedding=True) == 2 * per_layer + 2 * 32
    assert model.num_params() == model.num_params(non_embedding=True) + 320 * 32 + 16 * 32


def test_swiglu_untied_and_rmsnorm():
    arch = ArchConfig(layers=1, hidden=64, heads=2, seq_len=8, mlp="swiglu", norm="rmsnorm", tie_embeddings=False)
    model = GPT(arch, 256)
    assert arch.ffn_dim == 192
    assert model.head.weight is not model.tok_emb.weight
    assert model(torch.zeros(1, 8, dtype=torch.long)).shape == (1, 8, 256)


LLAMA_STYLE = dict(heads=4, kv_heads=2, position="rope", bias=False, mlp="swiglu", norm="rmsnorm", tie_embeddings=False)


@pytest.mark.parametrize("arch_kw", [{}, LLAMA_STYLE], ids=["gpt", "llama-gqa-rope"])
@pytest.mark.parametrize("seq_len", [16, 256])
def test_flops_per_token_matches_what_torch_counts(seq_len, arch_kw):
    """flops_per_token against torch's FLOP counter on a real forward+backward of the model (not the formula
    re-typed). N is torch's own parameter count without the embeddings and the output layer. The blocks' matmuls
    are 6·N (biases and norms, in N but no matmul, are < 1 %); the attention term is half of the QK^T and AV
    products the math kernel executes, as a causal mask needs only the lower triangle; the output projection (tied
    or not) is outside N and left out. Grouped-query attention: the math kernel repeats each key/value head to its
    query heads before its bmm (``torch/nn/attention`` math path; torch 2.13's ``sdpa_flop_count`` also takes fewer
    key/value heads), so attention costs every query head's QK^T and AV — the formula's H·head_dim — while the
    smaller wk/wv shrink N. Rotary positions are elementwise (no matmul): nothing to add."""
    vocab = 64
    arch = ArchConfig(**{"layers": 2, "hidden": 128, "heads": 2, "seq_len": seq_len, **arch_kw})
    torch.manual_seed(0)
    model = GPT(arch, vocab)
    n = sum(p.numel() for name, p in model.named_parameters() if not name.startswith(("tok_emb.", "pos_emb.", "head.")))
    assert n == model.num_params(non_embedding=True)
    x = torch.randint(0, vocab, (1, seq_len))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        loss_fn(model(x), x).backward()
    counts = counter.get_flop_counts()
    total = sum(counts["Global"].values())
    attention = counts["Global"][torch.ops.aten.bmm]
    head = sum(counts["GPT.head"].values())
    matmuls = total - attention - head
    assert attention > 0 and head > 0  # the counter saw the attention kernel and the output projection
    assert flops_per_token(arch, 0) * seq_len == attention / 2
    assert (flops_per_token(arch, n) - flops_per_token(arch, 0)) * seq_len == pytest.approx(matmuls, rel=0.01)


def test_init_is_per_parameter_and_independent_of_construction_order():
    """Each parameter's values come from its own name and the seed, not from a global RNG stream: a model
    built on the meta device and initialised later equals one built directly, whatever ran in between."""
    arch = ArchConfig(layers=2, hidden=32, heads=4, seq_len=16, mlp="swiglu", tie_embeddings=False)
    direct = GPT(arch, 64, seed=3)
    with torch.device("meta"):
        late = GPT(arch, 64)
    late.to_empty(device="cpu")
    torch.rand(1000)  # consume the global stream: must not matter
    late.init_weights(3)
    for (name, a), (_, b) in zip(direct.named_parameters(), late.named_parameters()):
        assert torch.equal(a, b), name
    other = GPT(arch, 64, seed=4)
    assert not torch.equal(other.blocks["0"].attn.wq.weight, direct.blocks["0"].attn.wq.weight)
    assert direct.blocks["0"].attn.wo.weight.std() < direct.blocks["0"].attn.wq.weight.std()  # residual scaling


def test_separate_projections_split_by_heads():
    """q, k, v are separate linears: the first half of wq's rows (what tp=2 rank 0 holds) are heads 0..h/2-1."""
    arch = ArchConfig(layers=1, hidden=32, heads=4, seq_len=8)
    attn = GPT(arch, 64).blocks["0"].attn
    assert [n for n, _ in attn.named_parameters()] == [f"{w}.{k}" for w in ("wq", "wk", "wv", "wo") for k in ("weight", "bias")]
    x = torch.randn(1, 8, 32)
    q = attn.wq(x).view(1, 8, -1, attn.head_dim)
    half = torch.nn.functional.linear(x, attn.wq.weight[:16], attn.wq.bias[:16]).view(1, 8, -1, attn.head_dim)
    assert torch.allclose(q[:, :, :2], half)


def test_lr_schedule_warmup_cosine_linear_constant():
    cfg = TrainingConfig(max_steps=110, lr=1.0, min_lr=0.1, warmup_steps=10)
    assert lr_at(0, cfg) == 0.1 and lr_at(9, cfg) == 1.0
    assert lr_at(10, cfg) == 1.0
    assert abs(lr_at(60, cfg) - 0.55) < 1e-9
    assert abs(lr_at(110, cfg) - 0.1) < 1e-9
    lin = cfg.model_copy(update={"schedule": "linear"})
    assert abs(lr_at(35, lin) - (0.1 + 0.9 * 0.75)) < 1e-9
    const = cfg.model_copy(update={"schedule": "constant"})
    assert lr_at(100, const) == 1.0


def test_no_weight_decay_on_vectors():
    arch = ArchConfig(layers=1, hidden=32, heads=2, seq_len=8)
    opt = build_optimizer(GPT(arch, 64), TrainingConfig(max_steps=1, weight_decay=0.1))
    decay, no_decay = opt.param_groups
    assert all(p.dim() >= 2 for p in decay["params"]) and decay["weight_decay"] == 0.1
    assert all(p.dim() == 1 for p in no_decay["params"]) and no_decay["weight_decay"] == 0.0


def test_a_tensor_parallel_half_of_gqa_heads_computes_their_share_of_attention():
    """Grouped-query attention split as tp 2 splits it (the first half of the rows of wq, wk and wv: query heads 0-3
    and key/value head 0 of 2): rank 0's attention output is the first half of the whole model's, heads in order —
    query head i reads key/value head i // (heads / kv_heads), the grouping a row split keeps together."""
    import torch.nn.functional as F

    arch = ArchConfig(layers=1, hidden=64, heads=8, kv_heads=2, seq_len=8, position="rope", bias=False)
    attn = GPT(arch, 64, seed=1).blocks["0"].attn
    x = torch.randn(2, 8, 64)
    b, t, d = 2, 8, arch.head_dim
    full = {}
    attn.wo.register_forward_hook(lambda m, args, out: full.setdefault("y", args[0]))
    attn(x)
    cos, sin = rope_tables(arch, t, x.device)
    q = apply_rope(F.linear(x, attn.wq.weight[:32]).view(b, t, 4, d).transpose(1, 2), cos, sin)
    k = apply_rope(F.linear(x, attn.wk.weight[:8]).view(b, t, 1, d).transpose(1, 2), cos, sin)
    v = F.linear(x, attn.wv.weight[:8]).view(b, t, 1, d).transpose(1, 2)
    half = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2).reshape(b, t, 32)
    assert torch.allclose(full["y"][..., :32], half, atol=1e-6)
    assert not torch.allclose(full["y"][..., 32:], half, atol=1e-3)  # the other half reads the other key/value head
