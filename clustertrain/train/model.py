"""A GPT: pre-norm blocks, causal self-attention through ``scaled_dot_product_attention``,
GELU or SwiGLU MLP, learned or rotary positions, multi-head or grouped-query attention, optional linear
biases, optionally tied input/output embeddings — the classic GPT-2 shape and the Llama family
(``models[].model``, :class:`clustertrain.train.config.ArchConfig`).

Rotary positions follow the Hugging Face Llama convention (``transformers/models/llama/modeling_llama.py``:
``rotate_half`` pairs dimension ``j`` with ``j + head_dim / 2``, frequencies ``theta ** (-2j / head_dim)``,
with Llama 3.1's scaling when ``rope_scaling`` is set), so a Llama checkpoint's q/k weights load without a
permutation (:mod:`clustertrain.core.hf_format`). Grouped-query attention: query head ``i`` reads key/value
head ``i // (heads / kv_heads)`` (``scaled_dot_product_attention(enable_gqa=True)``; the same grouping as
``repeat_kv``), so a tensor-parallel rank that holds query heads ``[r·H/tp, (r+1)·H/tp)`` holds exactly their
key/value heads ``[r·K/tp, (r+1)·K/tp)``.

Built for sharding (:mod:`clustertrain.train.parallel`): q, k, v and the SwiGLU gate/up are
separate linears, so a column-wise tensor-parallel split divides *heads* (not q from k) and
attention works on however many heads its shard holds; ``forward`` returns logits and the loss is
:func:`loss_fn`, outside the model (what loss parallelism and pipeline schedules need). The model
is meant to be built on the meta device, sharded, materialised (``to_empty``) and then initialised
with :meth:`GPT.init_weights`, which gives every parameter the same values whatever the layout.

Parameter names (FQNs) are the checkpoint's keys and the planner's tensor list
(:func:`clustertrain.core.model_shape.parameter_tensors`)::

    tok_emb.weight [V,h]   pos_emb.weight [s,h]   (learned positions only)
    blocks.{i}.norm1.*  blocks.{i}.attn.{wq,wk,wv,wo}.{weight,bias}   (wk, wv: [kv_heads x head_dim, h])
    blocks.{i}.norm2.*  blocks.{i}.mlp.{w_gate,w_up,w_down}.{weight,bias}   (w_gate: SwiGLU only; biases: bias: true)
    norm_f.*  head.weight [V,h] (the same tensor as tok_emb.weight when tied)

A pipeline stage (:mod:`clustertrain.train.parallel.pipeline`) is a ``GPT`` holding only some blocks
(``blocks`` is a ``ModuleDict`` keyed by the global block index, so a stage's names are the whole model's),
the embeddings only on the first stage and the final norm and output layer only on the last; its forward takes
token ids on the first stage, hidden states ``[b, s, h]`` elsewhere, and returns logits on the last stage,
hidden states elsewhere.

Checkpoints of the earlier fused-qkv model (checkpoint format 1) are refused in one line
(:mod:`clustertrain.train.checkpoint`).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from clustertrain.core.model_shape import training_flops_per_token
from clustertrain.train.config import ArchConfig
from clustertrain.core.parallel_layout import VOCAB_PAD

#: wrapper prefixes torch adds to parameter names (activation checkpointing, torch.compile)
_WRAPPER_PARTS = ("_checkpoint_wrapped_module.", "_orig_mod.")


def padded_vocab(arch: ArchConfig, tokenizer_vocab: int) -> int:
    """The model's vocabulary: the configured one, or the tokenizer's rounded up to a multiple of 64."""
    if arch.vocab is not None:
        return arch.vocab
    return (tokenizer_vocab + VOCAB_PAD - 1) // VOCAB_PAD * VOCAB_PAD


def _norm(arch: ArchConfig) -> nn.Module:
    if arch.norm == "rmsnorm":
        return nn.RMSNorm(arch.hidden, eps=arch.norm_eps)
    return nn.LayerNorm(arch.hidden, eps=arch.norm_eps)


def rope_frequencies(arch: ArchConfig) -> torch.Tensor:
    """The rotary inverse frequencies ``theta ** (-2j / head_dim)``, j < head_dim / 2 (fp32), with Llama 3.1's
    scaling (``arch.rope_scaling``): wavelengths longer than ``original_context / low_freq_factor`` divided by
    ``factor``, shorter than ``original_context / high_freq_factor`` kept, a linear blend in between (the Llama 3
    reference's ``apply_scaling``; Hugging Face ``rope_type: llama3``)."""
    d = arch.head_dim
    inv = 1.0 / (arch.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    sc = arch.rope_scaling
    if sc is not None:
        wavelen = 2 * math.pi / inv
        low, high = sc.original_context / sc.low_freq_factor, sc.original_context / sc.high_freq_factor
        smooth = ((sc.original_context / wavelen - sc.low_freq_factor) / (sc.high_freq_factor - sc.low_freq_factor))
        blended = (1 - smooth) * inv / sc.factor + smooth * inv
        inv = torch.where(wavelen > low, inv / sc.factor, torch.where(wavelen < high, inv, blended))
    return inv.float()


def rope_tables(arch: ArchConfig, seq: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) of shape ``[seq, head_dim]`` in fp32 for positions ``0..seq-1`` (each frequency twice: the
    half-split pairing of ``rotate_half``)."""
    angles = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), rope_frequencies(arch).to(device))
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[b, heads, s, head_dim]`` by the position angles (computed in fp32, returned in x's dtype)."""
    xf = x.float()
    half = xf.shape[-1] // 2
    rotated = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, arch: ArchConfig):
        super().__init__()
        self.arch = arch
        self.head_dim = arch.head_dim
        kv = arch.kv_head_count * arch.head_dim
        self.wq = nn.Linear(arch.hidden, arch.hidden, bias=arch.bias)
        self.wk = nn.Linear(arch.hidden, kv, bias=arch.bias)
        self.wv = nn.Linear(arch.hidden, kv, bias=arch.bias)
        self.wo = nn.Linear(arch.hidden, arch.hidden, bias=arch.bias)
        self.dropout = arch.dropout
        self.gqa = arch.kv_head_count != arch.heads
        self.recompute_core = False  # selective recomputation: keep q/k/v, recompute softmax(qk^T)v in backward
        self._rope: tuple | None = None  # (seq, device, cos, sin): the tables of the last sequence length

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0,
                                              enable_gqa=self.gqa)

    def _tables(self, seq: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if torch.compiler.is_compiling():
            return rope_tables(self.arch, seq, device)
        if self._rope is None or self._rope[0] != seq or self._rope[1] != device:
            self._rope = (seq, device, *rope_tables(self.arch, seq, device))
        return self._rope[2], self._rope[3]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (w(x).view(b, t, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        if self.arch.position == "rope":
            cos, sin = self._tables(t, x.device)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.recompute_core and torch.is_grad_enabled():
            y = checkpoint(self._core, q, k, v, use_reentrant=False)
        else:
            y = self._core(q, k, v)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, arch: ArchConfig):
        super().__init__()
        if arch.mlp == "swiglu":
            self.w_gate = nn.Linear(arch.hidden, arch.ffn_dim, bias=arch.bias)
        self.w_up = nn.Linear(arch.hidden, arch.ffn_dim, bias=arch.bias)
        self.w_down = nn.Linear(arch.ffn_dim, arch.hidden, bias=arch.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "w_gate"):
            h = F.silu(self.w_gate(x)) * self.w_up(x)
        else:
            h = F.gelu(self.w_up(x), approximate="tanh")
        return self.w_down(h)


class Block(nn.Module):
    def __init__(self, arch: ArchConfig):
        super().__init__()
        self.norm1 = _norm(arch)
        self.attn = Attention(arch)
        self.norm2 = _norm(arch)
        self.mlp = MLP(arch)
        self.drop = nn.Dropout(arch.dropout)
        self.recompute = False  # full recomputation: keep only the block's input, redo the block in backward

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.norm1(x)))
        return x + self.drop(self.mlp(self.norm2(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute and torch.is_grad_enabled():
            return checkpoint(self._forward, x, use_reentrant=False)
        return self._forward(x)


class GPT(nn.Module):
    """The whole model, or (``layers``, ``first``, ``last``) one pipeline stage of it (module docstring)."""

    def __init__(self, arch: ArchConfig, vocab: int, seed: int = 0, layers: Sequence[int] | None = None,
                 first: bool = True, last: bool = True):
        super().__init__()
        self.arch = arch
        self.vocab = vocab
        self.tok_emb = nn.Embedding(vocab, arch.hidden) if first else None
        self.pos_emb = nn.Embedding(arch.seq_len, arch.hidden) if first and arch.position == "learned" else None
        self.drop = nn.Dropout(arch.dropout) if first else None
        # where sequence parallelism splits the residual stream along the sequence
        self.seq_split = nn.Identity() if first else None
        self.blocks = nn.ModuleDict({str(i): Block(arch) for i in (range(arch.layers) if layers is None else layers)})
        self.norm_f = _norm(arch) if last else None
        self.head = nn.Linear(arch.hidden, vocab, bias=False) if last else None
        if arch.tie_embeddings and first and last:
            self.head.weight = self.tok_emb.weight
        if next(self.parameters()).device.type != "meta":
            self.init_weights(seed)

    @property
    def first(self) -> bool:
        return self.tok_emb is not None

    @property
    def last(self) -> bool:
        return self.head is not None

    def view(self, layers: Sequence[int], first: bool, last: bool) -> "GPT":
        """A stage of this model that shares its modules (no new parameters): blocks ``layers``, the embeddings
        when ``first``, the final norm and output layer when ``last`` — a virtual pipeline stage of the rank
        that holds this model's blocks."""
        view = GPT.__new__(GPT)
        nn.Module.__init__(view)
        view.arch, view.vocab = self.arch, self.vocab
        for name in ("tok_emb", "pos_emb", "drop", "seq_split"):
            setattr(view, name, getattr(self, name) if first else None)
        view.blocks = nn.ModuleDict({str(i): self.blocks[str(i)] for i in layers})
        for name in ("norm_f", "head"):
            setattr(view, name, getattr(self, name) if last else None)
        return view

    def tie_weights(self) -> None:
        """Re-tie the output layer to the embedding (after a transformation that replaced parameters)."""
        if self.arch.tie_embeddings and self.first and self.last:
            self.head.weight = self.tok_emb.weight

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Initialise every parameter from its own generator (seeded by ``seed`` and its name), so a sharded
        model holds exactly the slices of the unsharded one: the full tensor is drawn on the parameter's
        device, one tensor at a time, and each rank keeps its shard."""
        std = 0.02
        for name, p in self.named_parameters():
            name = clean_fqn(name)
            if p.dim() == 1:
                _fill_local(p, 1.0 if name.endswith("weight") else 0.0)
                continue
            scale = std / math.sqrt(2 * self.arch.layers) if name.endswith(("wo.weight", "w_down.weight")) else std
            device = _local(p).device
            gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
            full = torch.empty(p.shape, dtype=p.dtype, device=device).normal_(0.0, scale, generator=gen)
            copy_shard(p, full)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids -> logits (the whole model); a stage: ids or hidden states in, hidden states or logits out."""
        if self.tok_emb is not None:
            x = self.tok_emb(x)
            if self.pos_emb is not None:
                x = x + self.pos_emb(torch.arange(x.shape[1], device=x.device))
            x = self.seq_split(self.drop(x))
        for block in self.blocks.values():
            x = block(x)
        if self.head is None:
            return x
        return self.head(self.norm_f(x))

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameters of this model or stage (unsharded); tied weights counted once."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            if self.first:
                n -= self.tok_emb.weight.numel() + (self.pos_emb.weight.numel() if self.pos_emb is not None else 0)
            if self.last and not (self.arch.tie_embeddings and self.first):
                n -= self.head.weight.numel()
        return n


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in fp32 (a DTensor under loss parallelism)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def clean_fqn(name: str) -> str:
    """A parameter name without the prefixes activation-checkpoint and compile wrappers add."""
    for part in _WRAPPER_PARTS:
        name = name.replace(part, "")
    return name


def _local(p: torch.Tensor) -> torch.Tensor:
    return p.to_local() if hasattr(p, "to_local") else p


def _fill_local(p: torch.Tensor, value: float) -> None:
    _local(p).fill_(value)


def copy_shard(p: torch.Tensor, full: torch.Tensor) -> None:
    """Copy this rank's part of the full tensor ``full`` into ``p`` (a plain tensor, or a DTensor of any placements)."""
    if not hasattr(p, "device_mesh"):
        p.copy_(full)
        return
    from torch.distributed.tensor import distribute_tensor

    shard = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None).to_local()
    _local(p).copy_(shard)


def flops_per_token(arch: ArchConfig, non_embedding_params: int) -> float:
    """Training FLOPs per token of ``arch`` with ``non_embedding_params`` (the planner's formula,
    :func:`clustertrain.core.model_shape.training_flops_per_token`)."""
    return training_flops_per_token(non_embedding_params, arch.layers, arch.heads, arch.head_dim, arch.seq_len)
