"""The shape of the trainer's GPT (clustertrain/train/model.py) as plain numbers: its parameter
tensors with their tensor-parallel placement, parameter counts without building the model, and
training FLOPs with the trainer's own formula. A leaf: nothing here imports torch or another
clustertrain module at import time (the trainer's model imports this module, the planner too).

Parameter tensors (:func:`parameter_tensors`; h = hidden, f = ffn_dim, V = padded vocab, s = seq_len;
"tp dim" is the dimension tensor parallelism splits, ``Shard(d)``; none = replicated over tp):

=====================================  ==========  =======  =====================================
name                                   shape       tp dim   note
=====================================  ==========  =======  =====================================
tok_emb.weight                         [V, h]      0        vocabulary-parallel rows
pos_emb.weight                         [s, h]      -        ``position: learned`` only
blocks.{i}.norm1.weight (, .bias)      [h]         -        bias for LayerNorm only
blocks.{i}.attn.wq.weight (, .bias)    [h, h] [h]  0        column-parallel: heads split
blocks.{i}.attn.wk/wv.weight (, .bias) [k, h] [k]  0        k = kv_heads x head_dim: key/value heads split
blocks.{i}.attn.wo.weight              [h, h]      1        row-parallel
blocks.{i}.attn.wo.bias                [h]         -
blocks.{i}.norm2.*                     like norm1
blocks.{i}.mlp.w_gate (SwiGLU), w_up   [f, h] [f]  0        column-parallel weight and bias
blocks.{i}.mlp.w_down.weight           [h, f]      1        row-parallel
blocks.{i}.mlp.w_down.bias             [h]         -
norm_f.weight (, .bias)                [h]         -
head.weight                            [V, h]      0        absent when tied (one tensor with tok_emb)
=====================================  ==========  =======  =====================================

Linear biases (every ``.bias`` of a linear) exist only with ``bias: true`` (the default; Llama has none).
Counts: per block 2h² + 2hk + (2h + 2k) (attention; k = kv_heads x head_dim, = h without grouped-query
attention; biases only with ``bias``) + m·f·h + f·h + (m·f + h) (MLP; m = 2 for SwiGLU) + two norms (2h
each for LayerNorm, h for RMSNorm); embeddings V·h (+ s·h with learned positions), the head V·h unless
tied, final norm. Rotary positions have no parameters.
Non-embedding parameters (``GPT.num_params(non_embedding=True)``) exclude the token and position
embeddings and an untied head. ``tests/unit/plan/test_shape_memory.py`` checks names, shapes and counts
against the real model.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    ffn_dim: int
    mlp: str = "gelu"            # gelu | swiglu
    norm: str = "layernorm"      # layernorm | rmsnorm
    tie_embeddings: bool = True
    dropout: float = 0.0
    kv_heads: int | None = None  # None: = heads
    position: str = "learned"    # learned | rope
    bias: bool = True            # biases on the linear layers

    @classmethod
    def from_arch(cls, arch, vocab: int) -> "ModelShape":
        """From a project ``ArchConfig`` and the model's (padded) vocabulary."""
        return cls(arch.layers, arch.hidden, arch.heads, arch.seq_len, vocab, arch.ffn_dim, arch.mlp, arch.norm,
                   arch.tie_embeddings, arch.dropout, arch.kv_head_count, arch.position, arch.bias)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_head_count(self) -> int:
        """Key/value heads (``ArchConfig.kv_head_count``: ``heads`` without grouped-query attention)."""
        return self.kv_heads or self.heads

    @property
    def kv_dim(self) -> int:
        """Width of the key (and the value) projection: kv_heads x head_dim."""
        return self.kv_head_count * self.head_dim

    @property
    def mlp_factor(self) -> int:
        return 2 if self.mlp == "swiglu" else 1

    @property
    def norm_params(self) -> int:
        return 2 * self.hidden if self.norm == "layernorm" else self.hidden

    @property
    def norm_tensors(self) -> int:
        return 2 if self.norm == "layernorm" else 1

    def layer_params(self) -> int:
        h, f, m, k = self.hidden, self.ffn_dim, self.mlp_factor, self.kv_dim
        biases = (2 * h + 2 * k) + (m * f + h) if self.bias else 0
        return 2 * h * h + 2 * h * k + m * f * h + f * h + biases + 2 * self.norm_params

    def embedding_params(self) -> int:
        """Token (+ learned position) embeddings, plus the head when untied."""
        positions = self.seq_len * self.hidden if self.position == "learned" else 0
        return self.vocab * self.hidden * (1 if self.tie_embeddings else 2) + positions

    def non_embedding_params(self) -> int:
        return self.layers * self.layer_params() + self.norm_params

    def total_params(self) -> int:
        return self.non_embedding_params() + self.embedding_params()

    def param_tensors(self) -> int:
        """Parameter tensors (tied weights once): ``len(parameter_tensors(self))``."""
        per_linear = 2 if self.bias else 1
        per_layer = per_linear * (4 + self.mlp_factor + 1) + 2 * self.norm_tensors
        embeddings = 2 if self.position == "learned" else 1
        return self.layers * per_layer + embeddings + self.norm_tensors + (0 if self.tie_embeddings else 1)

    def describe(self) -> str:
        """The architecture in a line (``clustertrain plan``): ``32 layers, hidden 4096, 32 heads, ffn 14336; Llama-style:
        rope, GQA 8 kv heads, RMSNorm, SwiGLU, no bias, untied`` — Llama-style is rope + RMSNorm + SwiGLU without
        biases, GPT-style learned positions + LayerNorm + GELU with biases, anything else ``custom``."""
        kind = {("rope", "rmsnorm", "swiglu", False): "Llama-style",
                ("learned", "layernorm", "gelu", True): "GPT-style"}.get((self.position, self.norm, self.mlp, self.bias),
                                                                         "custom")
        kv = self.kv_head_count
        attention = "MHA" if kv == self.heads else "MQA" if kv == 1 else f"GQA {kv} kv heads"
        parts = ["rope" if self.position == "rope" else "learned positions", attention,
                 "RMSNorm" if self.norm == "rmsnorm" else "LayerNorm", "SwiGLU" if self.mlp == "swiglu" else "GELU",
                 "biases" if self.bias else "no bias", "tied" if self.tie_embeddings else "untied"]
        return (f"{self.layers} layers, hidden {self.hidden}, {self.heads} heads, ffn {self.ffn_dim}; "
                f"{kind}: {', '.join(parts)}")

    def flops_per_token(self) -> float:
        """Training FLOPs per token of this shape (:func:`training_flops_per_token`)."""
        return training_flops_per_token(self.non_embedding_params(), self.layers, self.heads, self.head_dim, self.seq_len)


@dataclass(frozen=True)
class ParamTensor:
    """One parameter tensor of the trainer's GPT: its name (FQN, the checkpoint key), global shape, the
    dimension tensor parallelism splits (None: replicated over tp) and its FSDP2 group (the block index,
    or None for the root group: embeddings, final norm, head)."""

    name: str
    shape: tuple[int, ...]
    tp_dim: int | None
    block: int | None

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def parameter_tensors(shape: ModelShape) -> list[ParamTensor]:
    """Every parameter tensor of the trainer's GPT of ``shape`` (table in the module docstring), tied weights once."""
    h, f, s, v, kv = shape.hidden, shape.ffn_dim, shape.seq_len, shape.vocab, shape.kv_dim
    norm = ("weight", "bias") if shape.norm == "layernorm" else ("weight",)
    out = [ParamTensor("tok_emb.weight", (v, h), 0, None)]
    if shape.position == "learned":
        out.append(ParamTensor("pos_emb.weight", (s, h), None, None))
    for i in range(shape.layers):
        b = f"blocks.{i}."

        def linear(name: str, rows: int, cols: int, column_parallel: bool) -> list[ParamTensor]:
            weight = [ParamTensor(f"{b}{name}.weight", (rows, cols), 0 if column_parallel else 1, i)]
            return weight + ([ParamTensor(f"{b}{name}.bias", (rows,), 0 if column_parallel else None, i)]
                             if shape.bias else [])

        out += [ParamTensor(f"{b}norm1.{k}", (h,), None, i) for k in norm]
        out += linear("attn.wq", h, h, True)
        for name in ("attn.wk", "attn.wv"):
            out += linear(name, kv, h, True)
        out += linear("attn.wo", h, h, False)
        out += [ParamTensor(f"{b}norm2.{k}", (h,), None, i) for k in norm]
        for name in (("mlp.w_gate", "mlp.w_up") if shape.mlp == "swiglu" else ("mlp.w_up",)):
            out += linear(name, f, h, True)
        out += linear("mlp.w_down", h, f, False)
    out += [ParamTensor(f"norm_f.{k}", (h,), None, None) for k in norm]
    if not shape.tie_embeddings:
        out.append(ParamTensor("head.weight", (v, h), 0, None))
    return out


def training_flops_per_token(non_embedding_params: int, layers: int, heads: int, head_dim: int, seq_len: int) -> float:
    """Training FLOPs per token, the one formula planner and trainer (MFU) share: 6·N for the
    non-embedding matmuls (forward + backward) + 6·L·H·head_dim·seq for attention's QK^T and AV with
    the causal half counted. ``tests/unit/train/test_model.py`` checks it against torch's FLOP counter."""
    return 6.0 * non_embedding_params + 6.0 * layers * heads * head_dim * seq_len
