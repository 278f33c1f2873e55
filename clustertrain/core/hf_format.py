"""Hugging Face model directories, the format both ways: which ``transformers`` class represents an architecture
(``models[].model``), the ``config.json`` it gets, the architecture a ``config.json`` describes, and how every HF
tensor is made of the trainer's tensors (:mod:`clustertrain.train.model`'s names) and back. Written by
``clustertrain export`` (:mod:`clustertrain.hf.export`), read by ``training.init_from`` (:mod:`clustertrain.train.init_from`).
A leaf: pure Python at import (torch only inside the conversion functions).

Two classes cover the trainer's architectures:

``LlamaForCausalLM`` (``model_type: llama``; transformers ``models/llama/modeling_llama.py``)
    ``position: rope``, ``norm: rmsnorm``, ``mlp: swiglu``; any ``kv_heads`` (``num_key_value_heads``), ``bias``
    (``attention_bias`` and ``mlp_bias``), tied or not (``tie_word_embeddings``), ``rope_scaling`` (``rope_type:
    llama3``). The trainer's rotary embedding uses Llama's ``rotate_half`` pairing, so every tensor is copied as
    it is::

        model.embed_tokens.weight                    tok_emb.weight
        model.layers.{i}.input_layernorm.weight       blocks.{i}.norm1.weight
        model.layers.{i}.self_attn.{q,k,v,o}_proj.*   blocks.{i}.attn.{wq,wk,wv,wo}.*
        model.layers.{i}.post_attention_layernorm.weight  blocks.{i}.norm2.weight
        model.layers.{i}.mlp.{gate,up,down}_proj.*    blocks.{i}.mlp.{w_gate,w_up,w_down}.*
        model.norm.weight                             norm_f.weight
        lm_head.weight                                head.weight (absent when tied)

``GPT2LMHeadModel`` (``model_type: gpt2``; ``models/gpt2/modeling_gpt2.py``)
    ``position: learned``, ``norm: layernorm``, ``mlp: gelu`` (GPT-2's ``gelu_new`` is the tanh approximation
    the trainer uses), ``bias: true``, ``kv_heads`` = ``heads``. GPT-2's ``Conv1D`` stores weights as
    ``[in, out]`` (transposed) and fuses q, k, v into ``c_attn``::

        transformer.wte.weight / wpe.weight            tok_emb.weight / pos_emb.weight
        transformer.h.{i}.ln_1.{weight,bias}           blocks.{i}.norm1.*
        transformer.h.{i}.attn.c_attn.weight [h, 3h]   cat(wq, wk, wv).T       (.bias: cat of the biases)
        transformer.h.{i}.attn.c_proj.weight           wo.weight.T
        transformer.h.{i}.ln_2.*                       blocks.{i}.norm2.*
        transformer.h.{i}.mlp.c_fc.weight [h, f]       w_up.weight.T
        transformer.h.{i}.mlp.c_proj.weight [f, h]     w_down.weight.T
        transformer.ln_f.*                             norm_f.*
        lm_head.weight                                 head.weight (absent when tied)

Any other combination (rope with LayerNorm or GELU, learned positions with SwiGLU, RMSNorm or grouped-query
attention, GPT-2 without biases) has no class and is refused in one line naming the field (:func:`hf_problems`).
The HF vocabulary (``vocab_size``) is the trainer's embedding rows (the padded vocabulary).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    import torch

    from clustertrain.train.config import ArchConfig

LLAMA = "LlamaForCausalLM"
GPT2 = "GPT2LMHeadModel"


def hf_problems(arch: "ArchConfig") -> list[tuple[str, str]]:
    """(field, problem) when no Hugging Face class represents ``arch`` (empty: :func:`hf_class` names one)."""
    out: list[tuple[str, str]] = []
    if arch.position == "rope":
        for field, value, want in (("model.norm", arch.norm, "rmsnorm"), ("model.mlp", arch.mlp, "swiglu")):
            if value != want:
                out.append((field, f"{value} with position: rope has no Hugging Face class ({LLAMA} needs "
                                   f"{field.split('.')[1]}: {want}); set {field}: {want}, or position: learned with "
                                   "layernorm and gelu for GPT2LMHeadModel"))
        return out
    for field, value, want in (("model.norm", arch.norm, "layernorm"), ("model.mlp", arch.mlp, "gelu")):
        if value != want:
            out.append((field, f"{value} with position: learned has no Hugging Face class ({GPT2} needs "
                               f"{field.split('.')[1]}: {want}); set position: rope (with rmsnorm and swiglu) for "
                               f"{LLAMA}, or {field}: {want}"))
    if arch.kv_head_count != arch.heads:
        out.append(("model.kv_heads", f"{arch.kv_head_count} key/value heads with position: learned has no Hugging Face "
                                      f"class ({GPT2} has one per query head); drop kv_heads, or use position: rope "
                                      f"(with rmsnorm and swiglu) for {LLAMA}"))
    if not arch.bias:
        out.append(("model.bias", f"false with position: learned has no Hugging Face class ({GPT2}'s layers all have "
                                  f"biases); set bias: true, or position: rope (with rmsnorm and swiglu) for {LLAMA}"))
    return out


def hf_class(arch: "ArchConfig") -> str:
    """``LlamaForCausalLM`` or ``GPT2LMHeadModel``; ValueError (the first of :func:`hf_problems`) otherwise."""
    problems = hf_problems(arch)
    if problems:
        field, problem = problems[0]
        raise ValueError(f"{field}: {problem}")
    return LLAMA if arch.position == "rope" else GPT2


def hf_config(arch: "ArchConfig", vocab: int, *, dtype: str = "float32", bos_token_id: int | None = None,
              eos_token_id: int | None = None) -> dict[str, Any]:
    """The ``config.json`` of ``arch`` with ``vocab`` embedding rows (rope parameters in the ``rope_theta`` /
    ``rope_scaling`` keys that transformers 4.x, 5.x and vLLM all read)."""
    cls = hf_class(arch)
    common = {"architectures": [cls], "vocab_size": vocab, "tie_word_embeddings": arch.tie_embeddings,
              "bos_token_id": bos_token_id, "eos_token_id": eos_token_id, "torch_dtype": dtype,
              "initializer_range": 0.02}
    if cls == LLAMA:
        cfg = {"model_type": "llama", "hidden_size": arch.hidden, "intermediate_size": arch.ffn_dim,
               "num_hidden_layers": arch.layers, "num_attention_heads": arch.heads,
               "num_key_value_heads": arch.kv_head_count, "head_dim": arch.head_dim, "hidden_act": "silu",
               "max_position_embeddings": arch.seq_len, "rms_norm_eps": arch.norm_eps, "rope_theta": arch.rope_theta,
               "attention_bias": arch.bias, "mlp_bias": arch.bias, "attention_dropout": arch.dropout,
               "rope_scaling": None, "use_cache": True}
        if arch.rope_scaling is not None:
            sc = arch.rope_scaling
            cfg["rope_scaling"] = {"rope_type": "llama3", "factor": sc.factor, "low_freq_factor": sc.low_freq_factor,
                                   "high_freq_factor": sc.high_freq_factor,
                                   "original_max_position_embeddings": sc.original_context}
        return {**cfg, **common}
    return {"model_type": "gpt2", "n_embd": arch.hidden, "n_layer": arch.layers, "n_head": arch.heads,
            "n_inner": arch.ffn_dim, "n_positions": arch.seq_len, "activation_function": "gelu_new",
            "layer_norm_epsilon": arch.norm_eps, "resid_pdrop": arch.dropout, "embd_pdrop": arch.dropout,
            "attn_pdrop": arch.dropout, "use_cache": True, **common}


def arch_from_hf(config: dict[str, Any], where: str = "config.json") -> dict[str, Any]:
    """The ``models[].model`` fields a Hugging Face ``config.json`` describes (all but ``seq_len``, a training
    choice; GPT-2's ``n_positions`` is returned as ``max_positions``). ValueError, one line naming ``where`` and the
    key, for a model type or feature the trainer does not have."""
    kind = config.get("model_type")
    if kind == "llama":
        heads = config["num_attention_heads"]
        hidden = config["hidden_size"]
        head_dim = config.get("head_dim") or hidden // heads
        if head_dim * heads != hidden:
            raise ValueError(f"{where}: head_dim {head_dim} x num_attention_heads {heads} != hidden_size {hidden}; the "
                             "trainer's heads are hidden / heads wide")
        if config.get("hidden_act", "silu") != "silu":
            raise ValueError(f"{where}: hidden_act {config['hidden_act']!r}; the trainer's SwiGLU uses silu")
        if bool(config.get("attention_bias", False)) != bool(config.get("mlp_bias", False)):
            raise ValueError(f"{where}: attention_bias and mlp_bias differ; the trainer's model.bias is one switch")
        rope = dict(config.get("rope_parameters") or {})
        scaling = config.get("rope_scaling") or (rope if rope.get("rope_type") not in (None, "default") else None)
        theta = config.get("rope_theta", rope.get("rope_theta", 10000.0))
        out = {"layers": config["num_hidden_layers"], "hidden": hidden, "heads": heads,
               "kv_heads": config.get("num_key_value_heads") or heads, "ffn_hidden": config["intermediate_size"],
               "vocab": config["vocab_size"], "position": "rope", "rope_theta": float(theta), "norm": "rmsnorm",
               "norm_eps": config.get("rms_norm_eps", 1e-6), "mlp": "swiglu",
               "bias": bool(config.get("attention_bias", False)),
               "tie_embeddings": bool(config.get("tie_word_embeddings", False))}
        if scaling:
            if scaling.get("rope_type", scaling.get("type")) != "llama3":
                raise ValueError(f"{where}: rope_scaling type {scaling.get('rope_type', scaling.get('type'))!r}; the "
                                 "trainer has Llama 3's (rope_type llama3) only")
            out["rope_scaling"] = {"factor": scaling["factor"], "low_freq_factor": scaling["low_freq_factor"],
                                   "high_freq_factor": scaling["high_freq_factor"],
                                   "original_context": scaling["original_max_position_embeddings"]}
        return out
    if kind == "gpt2":
        if config.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
            raise ValueError(f"{where}: activation_function {config['activation_function']!r}; the trainer's GELU is "
                             "the tanh approximation (gelu_new)")
        for key in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
            if config.get(key):
                raise ValueError(f"{where}: {key} is true; the trainer's attention does not do that")
        hidden = config["n_embd"]
        return {"layers": config["n_layer"], "hidden": hidden, "heads": config["n_head"],
                "ffn_hidden": config.get("n_inner") or 4 * hidden, "vocab": config["vocab_size"],
                "position": "learned", "norm": "layernorm", "norm_eps": config.get("layer_norm_epsilon", 1e-5),
                "mlp": "gelu", "bias": True, "tie_embeddings": bool(config.get("tie_word_embeddings", True)),
                "max_positions": config.get("n_positions", 1024)}
    raise ValueError(f"{where}: model_type {kind!r} is not one the trainer can load; it loads llama "
                     f"({LLAMA}) and gpt2 ({GPT2}) directories")


@dataclass(frozen=True)
class HFTensor:
    """One tensor of the HF state dict: its name, and how it is made of the trainer's ``sources`` — ``copy``
    (the one source as it is), ``t`` (the one source transposed), ``cat`` (the sources concatenated along
    dim 0), ``cat_t`` (concatenated along dim 0, then transposed: GPT-2's ``c_attn`` weight)."""

    name: str
    sources: tuple[str, ...]
    op: str = "copy"


def hf_tensors(arch: "ArchConfig") -> list[HFTensor]:
    """Every tensor of the HF model directory of ``arch``, in the order HF's own state dict lists them (tied output
    layer omitted, as ``save_pretrained`` does)."""
    cls = hf_class(arch)
    out: list[HFTensor] = []
    if cls == LLAMA:
        out.append(HFTensor("model.embed_tokens.weight", ("tok_emb.weight",)))
        linear = ("weight", "bias") if arch.bias else ("weight",)
        for i in range(arch.layers):
            b, h = f"blocks.{i}.", f"model.layers.{i}."
            out += [HFTensor(f"{h}self_attn.{p}_proj.{k}", (f"{b}attn.{o}.{k}",))
                    for p, o in (("q", "wq"), ("k", "wk"), ("v", "wv"), ("o", "wo")) for k in linear]
            out += [HFTensor(f"{h}mlp.{p}_proj.{k}", (f"{b}mlp.{o}.{k}",))
                    for p, o in (("gate", "w_gate"), ("up", "w_up"), ("down", "w_down")) for k in linear]
            out += [HFTensor(f"{h}input_layernorm.weight", (f"{b}norm1.weight",)),
                    HFTensor(f"{h}post_attention_layernorm.weight", (f"{b}norm2.weight",))]
        out.append(HFTensor("model.norm.weight", ("norm_f.weight",)))
    else:
        out += [HFTensor("transformer.wte.weight", ("tok_emb.weight",)),
                HFTensor("transformer.wpe.weight", ("pos_emb.weight",))]
        for i in range(arch.layers):
            b, h = f"blocks.{i}.", f"transformer.h.{i}."
            qkv = tuple(f"{b}attn.{w}" for w in ("wq", "wk", "wv"))
            out += [HFTensor(f"{h}ln_1.{k}", (f"{b}norm1.{k}",)) for k in ("weight", "bias")]
            out += [HFTensor(f"{h}attn.c_attn.weight", tuple(f"{q}.weight" for q in qkv), "cat_t"),
                    HFTensor(f"{h}attn.c_attn.bias", tuple(f"{q}.bias" for q in qkv), "cat"),
                    HFTensor(f"{h}attn.c_proj.weight", (f"{b}attn.wo.weight",), "t"),
                    HFTensor(f"{h}attn.c_proj.bias", (f"{b}attn.wo.bias",))]
            out += [HFTensor(f"{h}ln_2.{k}", (f"{b}norm2.{k}",)) for k in ("weight", "bias")]
            out += [HFTensor(f"{h}mlp.c_fc.weight", (f"{b}mlp.w_up.weight",), "t"),
                    HFTensor(f"{h}mlp.c_fc.bias", (f"{b}mlp.w_up.bias",)),
                    HFTensor(f"{h}mlp.c_proj.weight", (f"{b}mlp.w_down.weight",), "t"),
                    HFTensor(f"{h}mlp.c_proj.bias", (f"{b}mlp.w_down.bias",))]
        out += [HFTensor(f"transformer.ln_f.{k}", (f"norm_f.{k}",)) for k in ("weight", "bias")]
    if not arch.tie_embeddings:
        out.append(HFTensor("lm_head.weight", ("head.weight",)))
    return out


def to_hf(entry: HFTensor, tensors: dict[str, "torch.Tensor"]) -> "torch.Tensor":
    """The HF tensor ``entry`` from the trainer's full (unsharded) ``tensors`` (by name)."""
    import torch

    parts = [tensors[s] for s in entry.sources]
    if entry.op == "copy":
        return parts[0]
    if entry.op == "t":
        return parts[0].t().contiguous()
    joined = torch.cat(parts, dim=0)
    return joined.t().contiguous() if entry.op == "cat_t" else joined


def from_hf(arch: "ArchConfig", name: str, read: Callable[[str], "torch.Tensor"],
            index: dict[str, HFTensor] | None = None) -> "torch.Tensor":
    """The trainer's full tensor ``name`` from an HF directory, ``read(hf_name)`` giving an HF tensor; ``index``:
    :func:`source_index` of ``arch`` (built when not given). The tied output layer reads the embedding."""
    index = index if index is not None else source_index(arch)
    if name == "head.weight" and arch.tie_embeddings:
        name = "tok_emb.weight"
    entry = index[name]
    full = read(entry.name)
    if name == "pos_emb.weight":
        return full[:arch.seq_len].contiguous()  # GPT-2's n_positions may exceed the training context
    if entry.op == "copy":
        return full
    if entry.op == "t":
        return full.t().contiguous()
    if entry.op == "cat_t":
        full = full.t()
    k = entry.sources.index(name)
    size = full.shape[0] // len(entry.sources)
    return full[k * size:(k + 1) * size].contiguous()


def source_index(arch: "ArchConfig") -> dict[str, HFTensor]:
    """Each trainer tensor name -> the HF tensor it is (part of)."""
    return {s: entry for entry in hf_tensors(arch) for s in entry.sources}
