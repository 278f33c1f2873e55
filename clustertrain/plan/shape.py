"""The shape of the trainer's GPT (clustertrain/train/model.py) as plain numbers: parameter counts
without building the model, and training FLOPs with the trainer's own formula.

Parameters of ``GPT`` (h = hidden, f = ffn_dim, m = 2 for SwiGLU else 1, V = vocab, s = seq_len):
  per block: qkv 3h² + 3h, proj h² + h, up m·f·h + m·f, down f·h + h, two norms 2n
             (n = 2h for LayerNorm weight+bias, h for RMSNorm)
  embeddings: token V·h, position s·h; final norm n; head V·h unless tied.
Non-embedding parameters (``GPT.num_params(non_embedding=True)``) exclude the token and position
embeddings and an untied head. ``tests/unit/plan/test_shape_memory.py`` checks both against the real model.
Nothing here imports torch.
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

    @classmethod
    def from_arch(cls, arch, vocab: int) -> "ModelShape":
        """From a project ``ArchConfig`` and the model's (padded) vocabulary."""
        return cls(arch.layers, arch.hidden, arch.heads, arch.seq_len, vocab, arch.ffn_dim, arch.mlp, arch.norm,
                   arch.tie_embeddings, arch.dropout)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

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
        h, f, m = self.hidden, self.ffn_dim, self.mlp_factor
        return 4 * h * h + 3 * h + h + m * f * h + m * f + f * h + h + 2 * self.norm_params

    def embedding_params(self) -> int:
        """Token + position embeddings, plus the head when untied."""
        return self.vocab * self.hidden * (1 if self.tie_embeddings else 2) + self.seq_len * self.hidden

    def non_embedding_params(self) -> int:
        return self.layers * self.layer_params() + self.norm_params

    def total_params(self) -> int:
        return self.non_embedding_params() + self.embedding_params()

    def param_tensors(self) -> int:
        """Parameter tensors (tied weights once): 8 linear weights/biases + norms per block, 2 embeddings, final norm, head."""
        per_layer = 8 + 2 * self.norm_tensors
        return self.layers * per_layer + 2 + self.norm_tensors + (0 if self.tie_embeddings else 1)

    def flops_per_token(self) -> float:
        """Training FLOPs per token of this shape (:func:`training_flops_per_token`)."""
        return training_flops_per_token(self.non_embedding_params(), self.layers, self.heads, self.head_dim, self.seq_len)


def training_flops_per_token(non_embedding_params: int, layers: int, heads: int, head_dim: int, seq_len: int) -> float:
    """Training FLOPs per token, the one formula planner and trainer (MFU) share: 6·N for the
    non-embedding matmuls (forward + backward) + 6·L·H·head_dim·seq for attention's QK^T and AV with
    the causal half counted. ``tests/unit/train/test_model.py`` checks it against torch's FLOP counter."""
    return 6.0 * non_embedding_params + 6.0 * layers * heads * head_dim * seq_len


def model_vocab(arch, tokenizer: str) -> int:
    """The model's vocabulary as the trainer computes it: the configured one, or the tokenizer's rounded
    up to a multiple of 64 (``clustertrain.train.model.padded_vocab``; the test checks they agree)."""
    if arch.vocab is not None:
        return arch.vocab
    from clustertrain.data.tokenizers import load_tokenizer

    return (load_tokenizer(tokenizer).vocab_size + 63) // 64 * 64
