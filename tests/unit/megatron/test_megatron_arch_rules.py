"""What a Megatron model (``framework: megatron``) refuses of the architecture options, at load, in one line naming
the field: tensor parallelism that does not divide the key/value heads, a rope scaling Megatron-LM core_v0.16.1
cannot build, a fractional rotary base (its parser takes an int). The same options pass with the built-in trainer
where only Megatron is the limit."""

from __future__ import annotations

import pytest

from clustertrain.core.errors import ConfigError
from clustertrain.megatron.args import megatron_args
from tests.unit.megatron.test_args import _context, _model, _project

LLAMA = {"position": "rope", "norm": "rmsnorm", "mlp": "swiglu", "bias": False, "tie_embeddings": False}


def _refusal(framework: str, **sections) -> str | None:
    entry = _model("x", **sections)
    entry["framework"] = framework
    try:
        _project([entry])
    except ConfigError as err:
        return str(err)
    return None


def test_tp_must_divide_the_key_value_heads():
    message = _refusal("megatron", model={"kv_heads": 2}, parallelism={"tp": 4})
    assert message is not None and len(message.splitlines()) == 1
    assert "models[0].parallelism.tp: tp=4 does not divide model.kv_heads=2" in message and "valid tp: 1, 2" in message
    assert _refusal("megatron", model={"kv_heads": 2}, parallelism={"tp": 2}) is None


def test_only_llama31s_rope_scaling_renders_for_megatron():
    message = _refusal("megatron", model={**LLAMA, "rope_scaling": {"factor": 32.0}})   # Llama 3.2's factor
    assert message is not None and len(message.splitlines()) == 1
    assert "models[0].model.rope_scaling:" in message and "not factor 32;" in message
    assert _refusal("clustertrain", model={**LLAMA, "rope_scaling": {"factor": 32.0}}) is None
    assert _refusal("megatron", model={**LLAMA, "rope_scaling": {"original_context": 4096}}) is not None
    assert _refusal("megatron", model={**LLAMA, "rope_scaling": {}}) is None          # 8, 1, 4, 8192


def test_the_rotary_base_must_be_whole_for_megatron():
    message = _refusal("megatron", model={**LLAMA, "rope_theta": 10000.5})
    assert message is not None and "models[0].model.rope_theta: 10000.5 is not a whole number" in message
    assert "use 10000" in message
    assert _refusal("clustertrain", model={**LLAMA, "rope_theta": 10000.5}) is None


def test_the_llama_flags_appear_only_when_the_model_asks():
    project = _project([_model("x", model={**LLAMA, "kv_heads": 4, "rope_theta": 500000.0})])
    args = megatron_args(_context(project, project.models[0], 16))
    pairs = dict(zip(args, args[1:]))
    assert (pairs["--position-embedding-type"], pairs["--rotary-base"], pairs["--num-query-groups"]) == ("rope", "500000", "4")
    assert {"--group-query-attention", "--disable-bias-linear", "--swiglu", "--untie-embeddings-and-output-weights"} <= set(args)
    assert "--use-rope-scaling" not in args and "--no-rope-fusion" not in args      # transformer_engine: fused rope
    classic = _project([_model("y")])
    args = megatron_args(_context(classic, classic.models[0], 16))
    assert "learned_absolute" in args and not {"--rotary-base", "--group-query-attention", "--num-query-groups",
                                                "--disable-bias-linear", "--swiglu"} & set(args)


@pytest.mark.parametrize("kv_heads", [8, None])
def test_kv_heads_equal_to_heads_is_plain_multi_head_attention(kv_heads):
    model = {"kv_heads": kv_heads} if kv_heads else {}
    project = _project([_model("x", model=model)])
    args = megatron_args(_context(project, project.models[0], 16))
    assert "--group-query-attention" not in args and "--num-query-groups" not in args
