"""The model Megatron-LM builds from the rendered arguments is the model clustertrain counts and trains.

For a classic GPT, a Llama-style model (rope with Llama 3.1's scaling, grouped-query attention, RMSNorm, SwiGLU, no
linear biases, untied) and a mix (grouped-query attention with biases, LayerNorm, GELU, rope, tied), the rendered
list (tp 1, pp 1, ``--transformer-impl local``) goes through Megatron's own ``parse_args``, ``validate_args`` and
``gpt_builder`` at core_v0.16.1 on this CPU (tests/support/megatron_lm.py). Megatron's layout differs (one fused
``linear_qkv``, SwiGLU's gate and up in one ``linear_fc1``), its counts must not: every block and the whole model
have the parameters :class:`~clustertrain.core.model_shape.ModelShape` and the Megatron planner
(:func:`~clustertrain.plan.megatron_memory.stage_params`) say, and its rotary frequencies are the built-in GPT's.
"""

from __future__ import annotations

import math

import pytest
import torch

from clustertrain.core.model_shape import ModelShape
from clustertrain.megatron.args import megatron_args
from clustertrain.plan.megatron_memory import stage_params
from clustertrain.train.model import rope_frequencies
from tests.support.megatron_lm import build_with_megatron, megatron_source
from tests.unit.megatron.test_args import _context, _model, _project

TINY = {"layers": 2, "hidden": 64, "heads": 8, "seq_len": 32, "vocab": 256}
ARCHS = {
    "classic": {},
    "llama": {"kv_heads": 2, "position": "rope", "rope_theta": 500000, "rope_scaling": {}, "norm": "rmsnorm",
              "norm_eps": 1e-6, "mlp": "swiglu", "bias": False, "tie_embeddings": False},
    "gqa-bias-layernorm": {"kv_heads": 4, "position": "rope", "ffn_hidden": 96},
}


def _entry(arch: dict):
    model = _model("m", model={**TINY, **arch}, data={"tokenizer": "byte"}, parallelism={"param_dtype": "fp32"},
                   megatron={"transformer_impl": "local", "overlap_grad_reduce": False, "overlap_param_gather": False})
    project = _project([model], nodes=1, gpus=1)
    return project, project.models[0]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    source = megatron_source(tmp_path_factory.mktemp("megatron-lm-build"))
    cases = []
    for arch in ARCHS.values():
        project, entry = _entry(arch)
        cases.append({"args": megatron_args(_context(project, entry, 1))})
    return dict(zip(ARCHS, build_with_megatron(source, cases)))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ARCHS))
def test_megatron_builds_the_parameters_clustertrain_counts(built, name):
    _, entry = _entry(ARCHS[name])
    arch, theirs = entry.model, built[name]
    shape = ModelShape.from_arch(arch, TINY["vocab"])
    sizes = {n: math.prod(s) for n, s in theirs["params"].items()}
    assert sum(sizes.values()) == shape.total_params() == stage_params(shape, 1, 1, 0)
    for i in range(arch.layers):
        block = sum(v for n, v in sizes.items() if n.startswith(f"decoder.layers.{i}."))
        assert block == shape.layer_params(), f"{name}: block {i}"
    qkv = theirs["params"]["decoder.layers.0.self_attention.linear_qkv.weight"]
    assert qkv == [(arch.heads + 2 * arch.kv_head_count) * arch.head_dim, arch.hidden]
    has_bias = any(n.endswith("linear_qkv.bias") for n in theirs["params"])
    assert has_bias is arch.bias
    assert ("embedding.position_embeddings.weight" in theirs["params"]) is (arch.position == "learned")
    assert ("output_layer.weight" in theirs["params"]) is (not arch.tie_embeddings)
    assert theirs["eps"] == arch.norm_eps and theirs["groups"] == arch.kv_head_count


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n, a in ARCHS.items() if a.get("position") == "rope"])
def test_megatrons_rotary_frequencies_are_the_built_in_gpts(built, name):
    _, entry = _entry(ARCHS[name])
    theirs = torch.tensor(built[name]["inv_freq"], dtype=torch.float64)
    ours = rope_frequencies(entry.model).to(torch.float64)
    assert theirs.shape == ours.shape == (entry.model.head_dim // 2,)
    torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=0)   # Megatron computes them in float32
    if entry.model.rope_scaling is not None:                     # the scaling is applied: the lowest frequency / 8
        plain = 1.0 / (entry.model.rope_theta ** (torch.arange(0, entry.model.head_dim, 2, dtype=torch.float64)
                                                  / entry.model.head_dim))
        assert float(theirs[-1]) == pytest.approx(float(plain[-1]) / 8, rel=1e-5)
