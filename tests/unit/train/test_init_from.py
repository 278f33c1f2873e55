"""``training.init_from``: a Hugging Face directory made by ``transformers`` itself (a random ``LlamaForCausalLM``,
``save_pretrained``) loads into the trainer's GPT with the same logits, and every way the directory can disagree with
the project is one line naming both. The runs through ``clustertrain run`` (one process, tp 2, pp 2) are in
tests/integration/train/test_init_from_runs.py."""

from __future__ import annotations

import json
import math
import shutil
import textwrap
from pathlib import Path

import pytest
import torch

from clustertrain.core.errors import ConfigError
from clustertrain.core.hf_format import hf_config
from clustertrain.data.staging import builtin_corpus
from clustertrain.data.tokenizers import train_tokenizer
from clustertrain.project import read_project
from clustertrain.train.config import ArchConfig
from clustertrain.train.init_from import InitFromError, read_source
from clustertrain.train.init_from_check import init_from_findings, source_problems, stage_init_from
from clustertrain.train.model import GPT

TINY = dict(layers=2, hidden=64, heads=4, kv_heads=2, ffn_hidden=96, position="rope", norm="rmsnorm", mlp="swiglu",
            bias=False, rope_theta=50000.0, norm_eps=1e-5, tie_embeddings=False)


def make_tokenizer(where: Path, vocab: int = 320) -> Path:
    """A byte-level BPE of ``vocab`` ids trained on the bundled corpus (well under a second)."""
    return Path(train_tokenizer([builtin_corpus("builtin:shakespeare")], vocab, where / "tokenizer.json").path)


def make_hf_dir(where: Path, *, tied: bool = False, shard: str | None = None, seed: int = 0, scale: float = 0.3) -> Path:
    """A Hugging Face directory as transformers writes it: a random ``LlamaForCausalLM`` (weights drawn with std
    ``scale`` — far from a fresh model's, so the loss tells whether they arrived — and norm weights around 1) and
    its tokenizer (``PreTrainedTokenizerFast(...).save_pretrained``), vocab_size 320 (the tokenizer's 320 ids)."""
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok_dir = where.parent / f"{where.name}-tok"
    tok_dir.mkdir(parents=True, exist_ok=True)
    tok_file = make_tokenizer(tok_dir)
    config = LlamaConfig(vocab_size=320, hidden_size=TINY["hidden"], intermediate_size=TINY["ffn_hidden"],
                         num_hidden_layers=TINY["layers"], num_attention_heads=TINY["heads"],
                         num_key_value_heads=TINY["kv_heads"], rope_theta=TINY["rope_theta"],
                         rms_norm_eps=TINY["norm_eps"], max_position_embeddings=64, tie_word_embeddings=tied,
                         bos_token_id=0, eos_token_id=0)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if p.dim() == 1 else scale * torch.randn_like(p))
    kwargs = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(where, **kwargs)
    PreTrainedTokenizerFast(tokenizer_file=str(tok_file), eos_token="<|endoftext|>").save_pretrained(where)
    return where


def hf_loss(directory: Path, tokens: torch.Tensor) -> float:
    """The HF model's mean next-token loss on ``tokens`` ([batch, seq_len + 1]), fp32, as the trainer computes it."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(tokens[:, :-1]).logits
    return float(torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten()))


def project_yaml(tmp_path: Path, init_from: str, tokenizer: str, model: dict | None = None, name: str = "p.yaml",
                 extra_training: str = "", tiny: bool = True) -> Path:
    model = {**(TINY if tiny else {}), "seq_len": 32, **(model or {})}
    path = tmp_path / name
    path.write_text(textwrap.dedent(f"""\
        name: initfrom
        cluster: {{backend: local, gpus_per_node: 0, procs_per_node: 1}}
        storage: {{root: {json.dumps(str(tmp_path / 'fsx'))}}}
        models:
          - name: tiny
            model: {json.dumps(model)}
            data: {{source: "builtin:shakespeare", tokenizer: {json.dumps(tokenizer)}}}
            training: {{max_steps: 1, micro_batch: 2, global_batch: 4, init_from: {json.dumps(init_from)}{extra_training}}}
        """))
    return path


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {"untied": make_hf_dir(root / "untied"), "tied": make_hf_dir(root / "tied", tied=True, seed=1),
            "sharded": make_hf_dir(root / "sharded", shard="40KB", seed=2)}


@pytest.mark.parametrize("kind", ["untied", "tied", "sharded"])
def test_a_transformers_llama_loads_with_the_same_logits(hf_dirs, kind, tmp_path):
    from transformers import AutoModelForCausalLM

    directory = hf_dirs[kind]
    if kind == "sharded":
        assert (directory / "model.safetensors.index.json").is_file() and len(list(directory.glob("*.safetensors"))) > 2
    project = read_project(project_yaml(tmp_path, str(directory), str(directory / "tokenizer.json"),
                                        {"tie_embeddings": kind == "tied"}))
    entry = project.models[0]
    assert source_problems(entry, read_source(directory), 320) == []
    ours = GPT(entry.model, 320, seed=5)
    from clustertrain.train.init_from import load_init_from

    line = load_init_from(ours, project, entry, ours.num_params())
    assert line.startswith(f"weights: init_from {directory} (LlamaForCausalLM, ")
    theirs = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    tokens = torch.randint(0, 320, (2, 33), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = ours.eval()(tokens), theirs(tokens).logits
    # fp32 on one CPU: the same operations in a different order (fused SDPA vs HF's eager/sdpa path, GQA expansion)
    assert (a - b).abs().max() < 1e-4 * b.abs().max(), (a - b).abs().max()
    assert b.abs().max() > 1.0  # logits far from a fresh model's (std 0.02 weights): a wrong mapping would show


def test_the_loss_on_a_batch_differs_from_a_fresh_model_so_the_runs_comparison_can_fail(hf_dirs, tmp_path):
    tokens = torch.randint(0, 320, (4, 33), generator=torch.Generator().manual_seed(1))
    assert abs(hf_loss(hf_dirs["untied"], tokens) - math.log(320)) > 0.5


def _line(problem) -> str:
    return problem.line()


def test_a_shape_that_disagrees_is_one_line_naming_both(hf_dirs, tmp_path):
    directory = hf_dirs["untied"]
    project = read_project(project_yaml(tmp_path, str(directory), str(directory / "tokenizer.json"),
                                        {"hidden": 128, "kv_heads": 4}))
    lines = [_line(p) for p in source_problems(project.models[0], read_source(directory), 320)]
    assert lines == [
        f"model.hidden: 128 but {directory}/config.json hidden_size is 64; set model.hidden: 64",
        f"model.kv_heads: 4 but {directory}/config.json num_key_value_heads is 2; set model.kv_heads: 2",
    ]


def test_the_fix_names_the_preset_of_a_published_shape(tmp_path):
    """SmolLM2-135M's config.json (as the preset's own numbers write it) against a 512-wide model."""
    smol = tmp_path / "smol"
    smol.mkdir()
    (smol / "config.json").write_text(json.dumps(hf_config(ArchConfig(preset="smollm2-135m"), 49152)))
    (smol / "model.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")  # an empty safetensors file
    project = read_project(project_yaml(tmp_path, str(smol), "byte", {"preset": "smollm2-135m", "hidden": 512, "kv_heads": 2,
                                                                       "heads": 8, "seq_len": 256}, tiny=False))
    first = source_problems(project.models[0], read_source(smol), None)[0]
    assert first.line() == (f"model.hidden: 512 but {smol}/config.json hidden_size is 576; set model.hidden: 576 "
                            "(or model: {preset: smollm2-135m, seq_len: 256})")


def test_architecture_and_vocabulary_mismatches(hf_dirs, tmp_path):
    directory = hf_dirs["untied"]
    tok = str(directory / "tokenizer.json")
    cases = [
        ({"position": "learned", "norm": "layernorm", "mlp": "gelu", "bias": True},
         f"model.position: learned but {directory}/config.json model_type is llama (LlamaForCausalLM: position rope); "
         "set model.position: rope"),
        ({"tie_embeddings": True},
         f"model.tie_embeddings: true but {directory}/config.json tie_word_embeddings is false; set model.tie_embeddings: false"),
        ({"rope_theta": 10000.0},
         f"model.rope_theta: 10000.0 but {directory}/config.json rope_parameters.rope_theta is 50000.0; "
         "set model.rope_theta: 50000.0"),
        ({"vocab": 384}, f"model.vocab: 384 but {directory}/config.json vocab_size is 320; set model.vocab: 320"),
    ]
    for model, want in cases:
        project = read_project(project_yaml(tmp_path, str(directory), tok, model))
        assert _line(source_problems(project.models[0], read_source(directory), 320)[0]) == want


def test_a_tokenizer_that_encodes_differently_is_one_line(hf_dirs, tmp_path):
    directory = hf_dirs["untied"]
    other = make_tokenizer(tmp_path, vocab=300)
    project = read_project(project_yaml(tmp_path, str(directory), str(other), {"vocab": 320}))
    lines = [_line(p) for p in source_problems(project.models[0], read_source(directory), 300)]
    assert len(lines) == 1 and lines[0].startswith(f"data.tokenizer: {other} encodes with a different vocabulary "
                                                   "(300 tokens vs 320; ")
    assert lines[0].endswith(f"than {directory}/tokenizer.json; set data.tokenizer: {directory}/tokenizer.json "
                             "(the data is then tokenized with it)")
    # the same file elsewhere (another path, the same dictionaries) is fine: compared by content, not path or bytes
    copy = tmp_path / "copy" / "tokenizer.json"
    copy.parent.mkdir()
    copy.write_text(json.dumps(json.loads((directory / "tokenizer.json").read_text()), indent=1))
    project = read_project(project_yaml(tmp_path, str(directory), str(copy)))
    assert source_problems(project.models[0], read_source(directory), 320) == []
    project = read_project(project_yaml(tmp_path, str(directory), "byte", {"vocab": 320}))
    assert [_line(p) for p in source_problems(project.models[0], read_source(directory), 258)] == [
        f"data.tokenizer: byte, but the model of {directory} was trained with its tokenizer.json; "
        f"set data.tokenizer: {directory}/tokenizer.json (the data is then tokenized with it)"]


def test_missing_directory_config_or_weights_are_one_line_each(hf_dirs, tmp_path):
    broken = tmp_path / "broken"
    with pytest.raises(InitFromError, match=r"^training\.init_from: .*/nope: no such directory; give a directory"):
        read_source(tmp_path / "nope")
    shutil.copytree(hf_dirs["untied"], broken)
    (broken / "model.safetensors").unlink()
    with pytest.raises(InitFromError, match=r"broken: no model\.safetensors or model\.safetensors\.index\.json; give"):
        read_source(broken)
    (broken / "config.json").unlink()
    with pytest.raises(InitFromError, match=r"broken: no config\.json; give"):
        read_source(broken)
    sharded = tmp_path / "sharded"
    shutil.copytree(hf_dirs["sharded"], sharded)
    next(sharded.glob("model-0000*.safetensors")).unlink()
    with pytest.raises(InitFromError, match=r"model-\d{5}-of-\d{5}\.safetensors: missing \(the index names it\)"):
        read_source(sharded)


def test_run_preparation_refuses_before_anything_is_written(hf_dirs, tmp_path):
    from clustertrain.launch.prepare import prepare_run
    from clustertrain.resolve import load_project

    directory = hf_dirs["untied"]
    path = project_yaml(tmp_path, str(directory), str(directory / "tokenizer.json"), {"hidden": 128})
    project = load_project(path)
    with pytest.raises(ConfigError) as err:
        prepare_run(project, project.models[0], tmp_path / "run")
    assert str(err.value) == (f"{path}:6: models.tiny.model.hidden: 128 but {directory}/config.json hidden_size is 64; "
                              "set model.hidden: 64")
    assert not (tmp_path / "run").exists() and not (tmp_path / "fsx").exists()


def test_check_reports_every_problem_and_an_unverified_s3_directory(hf_dirs, tmp_path):
    from clustertrain.check import run_check
    from clustertrain.resolve import load_project

    directory = hf_dirs["untied"]
    project = load_project(project_yaml(tmp_path, str(directory), "byte", {"hidden": 128, "vocab": 320}))
    found = [(f.level, f.path, f.message) for s, f in run_check(project, only=["init_from"]).findings]
    assert [(lvl, p) for lvl, p, _ in found] == [("error", "models.tiny.model.hidden"), ("error", "models.tiny.data.tokenizer")]
    project = load_project(project_yaml(tmp_path, "s3://bucket/models/tiny/", "byte"))
    found = [(f.level, f.path, f.message) for s, f in run_check(project, only=["init_from"]).findings]
    assert found == [("warning", "models.tiny.training.init_from",
                      "s3://bucket/models/tiny/ was not verified: the check makes no network call")]


def test_init_from_paths_and_urls(tmp_path):
    path = project_yaml(tmp_path, "models/smol", "byte")
    assert read_project(path).models[0].training.init_from == str(tmp_path / "models" / "smol")
    assert read_project(project_yaml(tmp_path, "s3://b/m/", "byte")).models[0].training.init_from == "s3://b/m/"
    for bad in ("hf://HuggingFaceTB/SmolLM2-135M", "https://huggingface.co/x", ""):
        with pytest.raises(ConfigError, match=r"models\[0\]\.training\.init_from: .*huggingface-cli download NAME "
                                              r"--local-dir DIR"):
            read_project(project_yaml(tmp_path, bad, "byte"))


def test_a_local_directory_is_checked_where_it_is_named_and_an_s3_one_after_its_fetch(hf_dirs, tmp_path):
    """stage_init_from: a local directory is read in place (returned as it is); a Megatron model is refused."""
    directory = hf_dirs["tied"]
    project = read_project(project_yaml(tmp_path, str(directory), str(directory / "tokenizer.json"),
                                        {"tie_embeddings": True}))
    assert stage_init_from(project, project.models[0], 320) == directory
    assert init_from_findings(project) == []


EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "continue-smollm2.yaml"


def example_with(tmp_path: Path, directory: Path, **training) -> Path:
    """examples/continue-smollm2.yaml with the published SmolLM2-135M (no network here) replaced by a tiny local
    Hugging Face directory of the same family (Llama: rope, grouped-query attention, RMSNorm, SwiGLU, tied): its
    ``init_from``, its ``data.tokenizer`` and ``model`` (the preset's shape) point at the tiny one; storage under
    ``tmp_path``. Everything else is the example's."""
    import yaml

    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["storage"]["root"] = str(tmp_path / "fsx")
    model = raw["models"][0]
    assert model["model"]["preset"] == "smollm2-135m" and model["training"]["init_from"] == "../models/SmolLM2-135M"
    model["model"] = {**TINY, "tie_embeddings": True, "seq_len": 32}
    model["data"]["tokenizer"] = str(directory / "tokenizer.json")
    model["training"].update(init_from=str(directory), **training)
    path = tmp_path / "continue.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_the_example_checks_clean_with_a_tiny_directory_of_the_same_family(hf_dirs, tmp_path):
    from clustertrain.check import run_check
    from clustertrain.resolve import load_project

    # as shipped, only the download is missing: the directory and its tokenizer
    download = EXAMPLE.parent / ".." / "models" / "SmolLM2-135M"
    found = [(f.path, f.message) for _, f in run_check(load_project(EXAMPLE)).errors]
    assert download.exists() or found == [("models.smollm2-135m.data.tokenizer", f"{download}/tokenizer.json does not exist"),
                     ("models.smollm2-135m.training.init_from", f"{download}: no such directory")], found
    report = run_check(load_project(example_with(tmp_path, hf_dirs["tied"])))
    assert report.errors == [] and "init_from" in report.sections


@pytest.mark.parametrize("case", ["shape", "tokenizer", "missing"])
def test_clustertrain_run_refuses_bad_input_in_one_line_exit_2_nothing_written(hf_dirs, case, tmp_path, capsys):
    from clustertrain.cli import main
    from tests.support.files import snapshot

    directory = hf_dirs["untied"]
    tok, model, src = str(directory / "tokenizer.json"), {}, str(directory)
    if case == "shape":
        model = {"layers": 3}
    elif case == "tokenizer":
        tok = str(make_tokenizer(tmp_path, vocab=300))
        model = {"vocab": 320}
    else:
        src = str(tmp_path / "SmolLM2-135M")
    path = project_yaml(tmp_path, src, tok, model)
    before = snapshot(tmp_path)
    with pytest.raises(SystemExit) as done:
        main(["run", str(path), "--run-dir", str(tmp_path / "run")])
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert done.value.code == 2 and len(lines) == 1 and "Traceback" not in out + err, (out, err)
    want = {"shape": f"models.tiny.model.layers: 3 but {directory}/config.json num_hidden_layers is 2; set model.layers: 2",
            "tokenizer": f"models.tiny.data.tokenizer: {tok} encodes with a different vocabulary (300 tokens vs 320; ",
            "missing": f"models.tiny.training.init_from: {src}: no such directory; give a directory"}[case]
    assert lines[0].startswith(f"error: {path}:") and want in lines[0], lines[0]
    assert snapshot(tmp_path) == before


def test_a_megatron_model_is_refused(tmp_path):
    project = read_project(project_yaml(tmp_path, str(tmp_path / "hf"), "byte"), ["models.tiny.framework=megatron"])
    assert [(f.level, f.path, f.message) for f in init_from_findings(project)] == [
        ("error", "models.tiny.training.init_from",
         "loads a Hugging Face directory into the built-in trainer, not framework: megatron")]
    with pytest.raises(InitFromError, match=r"^training\.init_from: loads .* not framework: megatron; convert"):
        stage_init_from(project, project.models[0], 258)


def test_a_transformers_gpt2_loads_through_the_transposed_and_fused_tensors(tmp_path):
    """GPT-2's Conv1D weights ([in, out]) and fused c_attn are read whole and split (hf_format.from_hf); its
    n_positions (64) exceeds our seq_len (32): the first 32 rows are ours."""
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    directory = tmp_path / "gpt2"
    torch.manual_seed(7)
    theirs = GPT2LMHeadModel(GPT2Config(vocab_size=320, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                                        activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if p.dim() == 1 else 0.3 * torch.randn_like(p))
    theirs.save_pretrained(directory)
    tok = make_tokenizer(tmp_path)
    PreTrainedTokenizerFast(tokenizer_file=str(tok), eos_token="<|endoftext|>").save_pretrained(directory)
    project = read_project(project_yaml(tmp_path, str(directory), str(directory / "tokenizer.json"),
                                        {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 32}, tiny=False))
    entry = project.models[0]
    assert source_problems(entry, read_source(directory), 320) == []
    from clustertrain.train.init_from import load_init_from

    ours = GPT(entry.model, 320, seed=5)
    load_init_from(ours, project, entry, ours.num_params())
    tokens = torch.randint(0, 320, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = ours.eval()(tokens), theirs.eval()(tokens).logits
    assert (a - b).abs().max() < 1e-4 * b.abs().max(), (a - b).abs().max()
    too_long = read_project(project_yaml(tmp_path, str(directory), str(directory / "tokenizer.json"),
                                         {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 128}, tiny=False))
    assert [p.line() for p in source_problems(too_long.models[0], read_source(directory), 320)] == [
        f"model.seq_len: 128 but {directory}/config.json n_positions is 64 (learned positions: one row per position); "
        "set model.seq_len to at most 64"]
