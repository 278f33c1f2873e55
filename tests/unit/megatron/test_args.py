"""The pretrain_gpt.py argument lists clustertrain renders are ones Megatron-LM's own parser accepts.

Megatron-LM's ``parse_args`` and ``validate_args`` at core_v0.16.1 come from the tarball (tests/support/megatron_lm.py);
each list is also pinned by a golden file (``golden/<case>.args``, one word per line;
``CLUSTERTRAIN_UPDATE_GOLDEN=1`` rewrites them). Cases: the flagship's seven models as Megatron models, and
varied models covering swiglu, rmsnorm, untied embeddings, tp, pp with virtual stages, sequence parallelism,
both recompute modes, the distributed optimizer on and off, a blend, bf16 reduction and fp32, and Llama-style models
(rope with and without Llama 3.1's scaling, grouped-query attention, no linear biases, ``preset: llama3-8b``).
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from clustertrain.megatron.args import FLAGS, MegatronContext, megatron_args, rendered_options
from clustertrain.megatron.flags import FLAGS_FILE, known_options
from clustertrain.plan.node_counts import nodes_for
from clustertrain.project import validate_project
from clustertrain.resolve import load_project
from tests.support.golden import check_golden
from tests.support.megatron_lm import megatron_source, parse_with_megatron

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = Path(__file__).parent / "golden"
FLAGSHIP = ROOT / "examples" / "p5e-80x7.yaml"
RUN = Path("/fsx/checkpoints/runs")
TB = Path("/fsx/logs/tensorboard")


def _project(models: list[dict], nodes: int = 2, gpus: int = 8, time_limit: str | None = "4:00:00"):
    raw = {"name": "mg", "cluster": {"backend": "slurm", "nodes": nodes, "gpus_per_node": gpus,
                                     "instance_type": "p5.48xlarge", **({"time_limit": time_limit} if time_limit else {})},
           "storage": {"root": "/fsx"}, "models": models}
    return validate_project(raw)


def _model(name: str, **sections) -> dict:
    base = {"name": name, "framework": "megatron",
            "model": {"layers": 8, "hidden": 512, "heads": 8, "seq_len": 1024},
            "data": {"source": "/fsx/data/web/web", "tokenizer": "/fsx/data/tok/tokenizer.json"},
            "training": {"max_steps": 500, "micro_batch": 2, "global_batch": 64, "warmup_steps": 50}}
    for key, value in sections.items():
        base[key] = {**base.get(key, {}), **value}
    if "blend" in base["data"]:
        del base["data"]["source"]
    return base


VARIED = {
    # swiglu + rmsnorm + untied, tp 2 with sequence parallelism, distributed optimizer, byte tokenizer
    "swiglu-rmsnorm-untied-tp2-sp": _model(
        "a", model={"mlp": "swiglu", "norm": "rmsnorm", "tie_embeddings": False},
        data={"tokenizer": "byte"}, parallelism={"tp": 2, "sequence_parallel": True, "zero_stage": 1}),
    # pp 4 with 2 virtual stages per rank, full recompute, plain DDP, bf16 gradient reduction
    "pp4-vp2-full-recompute-ddp": _model(
        "b", model={"layers": 16}, parallelism={"pp": 4, "virtual_stages": 2, "recompute": "full", "reduce_dtype": "bf16"},
        megatron={"overlap_param_gather": False}),
    # a blend of two sources, tp 4, selective recompute, ZeRO 3 -> distributed optimizer, validation split
    "blend-tp4-selective": _model(
        "c", data={"blend": [{"source": "/fsx/data/web/web", "weight": 0.7}, {"source": "/fsx/data/code/code", "weight": 0.3}],
                   "split": "98,2,0"},
        parallelism={"tp": 4, "recompute": "selective", "zero_stage": 3}, megatron={"log_straggler": True}),
    # fp32, no overlap, explicit vocabulary and positions, extra args, linear decay, dropout
    "fp32-extra-args": _model(
        "d", model={"vocab": 32768, "dropout": 0.1, "seq_len": 2048}, training={"schedule": "linear", "grad_clip": 0.0},
        parallelism={"param_dtype": "fp32"},
        megatron={"overlap_grad_reduce": False, "overlap_param_gather": False, "max_position_embeddings": 4096,
                  "transformer_impl": "local", "extra_args": ["--attention-backend", "unfused", "--manual-gc"]}),
    # tp 2 x pp 2 with sp and the distributed optimizer, constant schedule, no time limit (no --exit-duration-in-mins)
    "tp2-pp2-sp-constant": _model(
        "e", training={"schedule": "constant", "micro_batch": 1}, parallelism={"tp": 2, "pp": 2, "sequence_parallel": True,
                                                                               "zero_stage": 2}),
    # Llama-style: rope (theta 500000), grouped-query attention (8 heads, 2 key/value heads split over tp 2), RMSNorm
    # (eps 1e-6), SwiGLU with Llama's width rule, no linear biases, untied output
    "llama-gqa-rope-tp2": _model(
        "f", model={"kv_heads": 2, "position": "rope", "rope_theta": 500000, "norm": "rmsnorm", "norm_eps": 1e-6,
                    "mlp": "swiglu", "ffn_multiple_of": 256, "bias": False, "tie_embeddings": False},
        parallelism={"tp": 2, "sequence_parallel": True, "zero_stage": 1}),
    # Llama 3.1's rope scaling (the one Megatron builds), GQA, tp 1 so validate_args runs to its end on CPU, the local
    # transformer (--no-rope-fusion)
    "llama31-rope-scaling-local": _model(
        "g", model={"kv_heads": 4, "position": "rope", "rope_theta": 500000, "rope_scaling": {}, "norm": "rmsnorm",
                    "mlp": "swiglu", "bias": False, "tie_embeddings": False},
        parallelism={"pp": 2}, megatron={"transformer_impl": "local"}),
    # the llama3-8b preset as it is, tp 2 x pp 2
    "llama3-8b-tp2-pp2": {**_model("h", parallelism={"tp": 2, "pp": 2, "sequence_parallel": True, "zero_stage": 1},
                                   training={"micro_batch": 1}),
                          "model": {"preset": "llama3-8b"}},
}


def _context(project, entry, world: int) -> MegatronContext:
    from clustertrain.data.staging import expected_prefix
    from clustertrain.core.storage_layout import storage_layout

    root = storage_layout(project).datasets  # a published source: where staging puts its copy; a prefix: itself
    data = tuple((w, expected_prefix(one, root) if one.source.startswith("s3://") else Path(one.source))
                 for w, one in entry.data.sources())
    return MegatronContext(project, entry, world, RUN / entry.name, data, TB / entry.name)


def _cases() -> list[tuple[str, list[str], int]]:
    out = []
    overrides = [f"models.model-{i}.framework=megatron" for i in range(1, 8)]
    flagship = load_project(FLAGSHIP, overrides)
    nodes = nodes_for(flagship)
    for entry in flagship.models:
        world = nodes[entry.name] * flagship.cluster.ranks_per_node
        out.append((f"p5e-80x7-{entry.name}", megatron_args(_context(flagship, entry, world)), world))
    for case, model in VARIED.items():
        project = _project([model], time_limit=None if case == "tp2-pp2-sp-constant" else "4:00:00")
        entry = project.models[0]
        out.append((case, megatron_args(_context(project, entry, project.cluster.world_size)), project.cluster.world_size))
    return out


CASES = _cases()


#: the architecture as Megatron's parser (and validate_args) leave it
ARCH_READ = ["position_embedding_type", "rotary_base", "rotary_percent", "use_rope_scaling", "rope_scaling_factor",
             "apply_rope_fusion", "group_query_attention", "num_query_groups", "add_bias_linear", "add_qkv_bias",
             "layernorm_epsilon", "normalization", "swiglu", "untie_embeddings_and_output_weights", "ffn_hidden_size",
             "hidden_size", "num_attention_heads", "seq_length"]


@pytest.fixture(scope="module")
def parsed(tmp_path_factory):
    source = megatron_source(tmp_path_factory.mktemp("megatron-lm"))
    results = parse_with_megatron(source, [
        {"args": args, "world": world, "read": ["num_layers", "data_parallel_size", "use_distributed_optimizer",
                                                 "recompute_granularity", "exit_signal", "data_path", "padded_vocab_size",
                                                 *ARCH_READ]}
        for _, args, world in CASES])
    return dict(zip([c[0] for c in CASES], results))


@pytest.mark.slow
@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_megatron_parse_args_accepts_the_rendered_list(parsed, case):
    result = parsed[case]
    assert result.accepted, f"{case}: Megatron-LM's parser refused: {result.error}"
    # validate_args runs to its end on CPU, or stops at a CUDA-only check (never at one of its own asserts)
    assert result.validated or result.cuda_stop, f"{case}: validate_args refused: {result.stopped}"


@pytest.mark.slow
def test_what_megatron_read_is_what_the_project_says(parsed):
    one = parsed["pp4-vp2-full-recompute-ddp"]
    assert one.values["num_layers"] == 16 and one.values["recompute_granularity"] == "full"
    assert one.values["use_distributed_optimizer"] is False
    assert one.validated, one.stopped  # tp 1: validate_args runs to its end on CPU
    assert one.values["data_parallel_size"] == 16 // 4  # 2 nodes x 8 GPUs / pp 4
    blend = parsed["blend-tp4-selective"]
    assert blend.values["use_distributed_optimizer"] is True
    assert blend.values["data_path"] == ["0.7", "/fsx/data/web/web", "0.3", "/fsx/data/code/code"]
    assert parsed["swiglu-rmsnorm-untied-tp2-sp"].values["exit_signal"] == signal.SIGUSR2
    assert parsed["fp32-extra-args"].values["padded_vocab_size"] == 32768


@pytest.mark.slow
def test_megatron_reads_the_llama_architecture(parsed):
    gqa = parsed["llama-gqa-rope-tp2"].values
    assert (gqa["position_embedding_type"], gqa["rotary_base"], gqa["rotary_percent"]) == ("rope", 500000, 1.0)
    assert (gqa["group_query_attention"], gqa["num_query_groups"], gqa["num_attention_heads"]) == (True, 2, 8)
    assert (gqa["add_bias_linear"], gqa["add_qkv_bias"], gqa["layernorm_epsilon"]) == (False, False, 1e-6)
    assert (gqa["normalization"], gqa["swiglu"], gqa["untie_embeddings_and_output_weights"]) == ("RMSNorm", True, True)
    assert gqa["ffn_hidden_size"] == 1536 and gqa["use_rope_scaling"] is False   # 2/3 x 4 x 512 = 1365 -> 256s
    scaled = parsed["llama31-rope-scaling-local"]
    assert scaled.validated, scaled.stopped                                      # tp 1: validate_args to its end
    assert (scaled.values["use_rope_scaling"], scaled.values["rope_scaling_factor"]) == (True, 8.0)
    assert scaled.values["apply_rope_fusion"] is False and scaled.values["num_query_groups"] == 4
    preset = parsed["llama3-8b-tp2-pp2"].values
    assert (preset["hidden_size"], preset["num_query_groups"], preset["ffn_hidden_size"], preset["seq_length"],
            preset["padded_vocab_size"], preset["rotary_base"]) == (4096, 8, 14336, 8192, 128256, 500000)
    classic = parsed["tp2-pp2-sp-constant"].values                              # the classic GPT stays Megatron's default
    assert (classic["position_embedding_type"], classic["add_bias_linear"], classic["group_query_attention"],
            classic["normalization"], classic["layernorm_epsilon"]) == ("learned_absolute", True, False, "LayerNorm", 1e-5)


@pytest.mark.slow
def test_megatron_refuses_what_clustertrain_must_never_render(tmp_path_factory):
    """The harness can fail: an option Megatron does not know is refused by its parser, and a sequence longer
    than the positions fails its validate_args (the rule megatron.rules checks as megatron.max_position_embeddings)."""
    source = megatron_source(tmp_path_factory.mktemp("megatron-lm-bad"))
    _, args, world = next(c for c in CASES if c[0] == "pp4-vp2-full-recompute-ddp")  # tp 1: validate_args runs on CPU
    bad = parse_with_megatron(source, [{"args": args + ["--no-such-option"], "world": world},
                                       {"args": args + ["--seq-length", "8192"], "world": world},
                                       {"args": args + ["--rotary-base", "500000.5"], "world": world}])
    assert not bad[0].accepted and "--no-such-option" in bad[0].error
    assert bad[1].accepted and bad[1].validated is False and not bad[1].cuda_stop
    assert "max_position_embeddings" in bad[1].stopped
    assert not bad[2].accepted and "--rotary-base" in bad[2].error   # an int: why model.rope_theta must be whole


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_rendered_list_matches_its_golden_file(case):
    args = dict((c[0], c[1]) for c in CASES)[case]
    check_golden(GOLDEN / f"{case}.args", "".join(a + "\n" for a in args))


def test_every_rendered_option_is_in_megatrons_flag_list():
    known = known_options()
    assert {f.option for f in FLAGS} <= known
    assert len(known) > 600


@pytest.mark.slow
def test_flag_list_is_megatrons_parser_at_the_tag(tmp_path_factory):
    """clustertrain/megatron/flags-core_v0.16.1.txt equals the option strings of the tag's own parser."""
    import subprocess
    import sys

    source = megatron_source(tmp_path_factory.mktemp("megatron-lm-flags"))
    code = ("import argparse,json;from megatron.training.arguments import add_megatron_arguments as a;"
            "p=a(argparse.ArgumentParser(allow_abbrev=False));"
            "print('@@'+json.dumps(sorted({o for x in p._actions for o in x.option_strings if o.startswith('--')})))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=source,
                          env={**__import__("os").environ, "PYTHONPATH": str(source), "PYTHONWARNINGS": "ignore"})
    line = [x for x in proc.stdout.splitlines() if x.startswith("@@")]
    assert line, proc.stderr[-2000:]
    import json

    assert set(json.loads(line[-1][2:])) == set(known_options()), f"regenerate {FLAGS_FILE.name} from the tag's parser"


def test_extra_args_cannot_repeat_a_rendered_option():
    assert rendered_options()["--lr"] == "training.lr"
    from clustertrain.megatron.rules import extra_arg_findings

    project = _project([_model("x", megatron={"extra_args": ["--lr", "1e-3", "--no-such-flag", "--manual-gc"]})])
    found = extra_arg_findings("models[0]", project.models[0])
    assert [f.path for f in found] == ["models[0].megatron.extra_args[0]", "models[0].megatron.extra_args[2]"]
    assert "set training.lr" in found[0].fix and "not an option" in found[1].message
