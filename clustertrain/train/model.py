"""A GPT: pre-norm blocks, causal self-attention through ``scaled_dot_product_attention``,
GELU or SwiGLU MLP, learned positions, optionally tied input/output embeddings."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from clustertrain.plan.shape import training_flops_per_token
from clustertrain.train.config import ArchConfig


def padded_vocab(arch: ArchConfig, tokenizer_vocab: int) -> int:
    """The model's vocabulary: the configured one, or the tokenizer's rounded up to a multiple of 64."""
    if arch.vocab is not None:
        return arch.vocab
    return (tokenizer_vocab + 63) // 64 * 64


def _norm(arch: ArchConfig) -> nn.Module:
    return nn.RMSNorm(arch.hidden) if arch.norm == "rmsnorm" else nn.LayerNorm(arch.hidden)


class Attention(nn.Module):
    def __init__(self, arch: ArchConfig):
        super().__init__()
        self.heads = arch.heads
        self.qkv = nn.Linear(arch.hidden, 3 * arch.hidden)
        self.proj = nn.Linear(arch.hidden, arch.hidden)
        self.dropout = arch.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class MLP(nn.Module):
    def __init__(self, arch: ArchConfig):
        super().__init__()
        self.swiglu = arch.mlp == "swiglu"
        self.up = nn.Linear(arch.hidden, (2 if self.swiglu else 1) * arch.ffn_dim)
        self.down = nn.Linear(arch.ffn_dim, arch.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x)
        if self.swiglu:
            gate, val = h.chunk(2, dim=-1)
            h = F.silu(gate) * val
        else:
            h = F.gelu(h, approximate="tanh")
        return self.down(h)


class Block(nn.Module):
    def __init__(self, arch: ArchConfig):
        super().__init__()
        self.norm1 = _norm(arch)
        self.attn = Attention(arch)
        self.norm2 = _norm(arch)
        self.mlp = MLP(arch)
        self.drop = nn.Dropout(arch.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.norm1(x)))
        return x + self.drop(self.mlp(self.norm2(x)))


class GPT(nn.Module):
    def __init__(self, arch: ArchConfig, vocab: int):
        super().__init__()
        self.arch = arch
        self.vocab = vocab
        self.tok_emb = nn.Embedding(vocab, arch.hidden)
        self.pos_emb = nn.Embedding(arch.seq_len, arch.hidden)
        self.drop = nn.Dropout(arch.dropout)
        self.blocks = nn.ModuleList(Block(arch) for _ in range(arch.layers))
        self.norm_f = _norm(arch)
        self.head = nn.Linear(arch.hidden, vocab, bias=False)
        if arch.tie_embeddings:
            self.head.weight = self.tok_emb.weight
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        std = 0.02
        for name, p in self.named_parameters():
            if p.dim() == 1:
                (nn.init.ones_ if name.endswith("weight") else nn.init.zeros_)(p)
            elif name.endswith(("proj.weight", "down.weight")):
                nn.init.normal_(p, std=std / math.sqrt(2 * self.arch.layers))  # GPT-2 residual scaling
            else:
                nn.init.normal_(p, std=std)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))

    def num_params(self, non_embedding: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())  # tied weights counted once
        if non_embedding:
            n -= self.tok_emb.weight.numel() + self.pos_emb.weight.numel()
            if not self.arch.tie_embeddings:
                n -= self.head.weight.numel()
        return n


def flops_per_token(arch: ArchConfig, non_embedding_params: int) -> float:
    """Training FLOPs per token of ``arch`` with ``non_embedding_params`` (the planner's formula,
    :func:`clustertrain.plan.shape.training_flops_per_token`)."""
    return training_flops_per_token(non_embedding_params, arch.layers, arch.heads, arch.head_dim, arch.seq_len)
