"""`clustertrain export` of real runs: tiny models trained 20 steps by `clustertrain run` on 2 gloo ranks in each
layout, exported, loaded by transformers (`AutoModelForCausalLM`, `AutoTokenizer`) and compared with our model loaded
from the same checkpoint in this process.

Layouts x architectures (one architecture per layout, alternating, to keep the runtime down: 4 runs of ~20 s
instead of 8; each architecture goes through a replicated and a sharded layout):

    ddp        classic GPT (learned positions, LayerNorm, GELU, biases, tied)      -> GPT2LMHeadModel
    fsdp       Llama-style GQA (heads 4, kv_heads 2, rope, RMSNorm, SwiGLU, no bias, untied) -> LlamaForCausalLM
    dp1xtp2    the Llama-style model: each tp rank holds one of the two key/value heads
    pp2        classic GPT, untied (pipelines need it), with a tiny byte-level BPE tokenizer.json

Tolerance (fp32 on CPU): transformers' layers compute the same sums as ours in other orders (GPT-2's Conv1D
``addmm`` on transposed weights, Llama's ``repeat_kv`` before attention against SDPA's ``enable_gqa``, its RMSNorm
written out); each reordering is worth a few fp32 ulps (~1e-7 relative) on logits of magnitude ~1-5, so after two
layers the difference is ~1e-6 at most (measured: 0 to ~5e-7). 1e-5 absolute is ten times that and far below what a
mapping mistake does (a transposed or swapped q/k/v weight, a wrong rotary pairing or head grouping changes logits
by > 1e-2).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from tests.support.training import run_cli

pytestmark = pytest.mark.slow

LLAMA = {"position": "rope", "norm": "rmsnorm", "mlp": "swiglu", "kv_heads": 2, "bias": False, "tie_embeddings": False}
LAYOUTS = {  # model name: (architecture fields, parallelism, HF class)
    "ddp": ({}, {}, "GPT2LMHeadModel"),
    "fsdp": (LLAMA, {"zero_stage": 3}, "LlamaForCausalLM"),
    "tp": (LLAMA, {"zero_stage": 3, "tp": 2}, "LlamaForCausalLM"),
    "pp": ({"tie_embeddings": False}, {"pp": 2}, "GPT2LMHeadModel"),
}
TEXT = "Héllo, wörld — to be or not to be 🙂\n\tthat is the question"
ATOL = 1e-5


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """The four models trained (one `clustertrain run` of the project), by name -> run directory."""
    from clustertrain.data.tokenizers import train_tokenizer

    root = tmp_path_factory.mktemp("export-runs")
    corpus = root / "corpus.txt"
    corpus.write_text("to be or not to be, that is the question; whether tis nobler in the mind to suffer\n" * 40)
    bpe = train_tokenizer([corpus], 300, root / "bpe" / "tokenizer.json")
    models = []
    for name, (arch, par, _) in LAYOUTS.items():
        data = {"data": {"tokenizer": str(bpe.path)}} if name == "pp" else {}
        models.append({"name": name, "model": {"layers": 2, "hidden": 32, "heads": 4, "seq_len": 32, **arch},
                       "training": {"max_steps": 20, "micro_batch": 2, "global_batch": 8, "lr": 3e-3, "min_lr": 3e-4,
                                    "warmup_steps": 2, "checkpoint_every": 10, "keep_last": 2, "log_every": 10,
                                    "seed": 5},
                       "parallelism": par, **data})
    project = root / "p.yaml"
    project.write_text(yaml.safe_dump({
        "name": "exp", "cluster": {"backend": "local", "gpus_per_node": 0, "procs_per_node": 2, "threads_per_worker": 1},
        "storage": {"root": str(root / "fsx")}, "models": models}, sort_keys=False))
    res = run_cli("run", str(project), timeout=600)
    assert res.returncode == 0, res.stdout[-3000:]
    return {name: root / "fsx" / "exp" / name for name in LAYOUTS} | {"_project": project}


def ours(run_dir: Path, tmp_path: Path, step: int | None = None):
    """Our GPT with the checkpoint's weights (read back through DCP's own whole-checkpoint conversion, another path
    than the exporter's) and our tokenizer."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from clustertrain.core.checkpoint_format import find_latest, step_dir_name
    from clustertrain.data.tokenizers import load_tokenizer
    from clustertrain.train.config import ArchConfig
    from clustertrain.train.model import GPT

    entry = next(m for m in yaml.safe_load((run_dir / "config.yaml").read_text())["models"] if m["name"] == run_dir.name)
    arch = ArchConfig(**entry["model"])
    ckpt = find_latest(run_dir / "checkpoints") if step is None else run_dir / "checkpoints" / step_dir_name(step)
    dcp_to_torch_save(str(ckpt), str(tmp_path / "full.pt"))
    state = torch.load(tmp_path / "full.pt", weights_only=False)["model_optim"]["model"]
    model = GPT(arch, state["tok_emb.weight"].shape[0])
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"head.weight"} and (not missing or arch.tie_embeddings)
    return model.eval(), load_tokenizer(entry["data"]["tokenizer"])


def greedy(model, ids: torch.Tensor, new: int, eos: int) -> torch.Tensor:
    """Our greedy continuation with the end of document never chosen (generate's min_new_tokens does the same)."""
    for _ in range(new):
        logits = model(ids)[:, -1].clone()
        logits[:, eos] = float("-inf")
        ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
    return ids


def hf_logits_match(out: Path, model, batch: torch.Tensor):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        theirs, mine = hf(batch).logits, model(batch)
    diff = (theirs - mine).abs().max().item()
    assert diff <= ATOL, diff
    return hf


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_export_loads_in_transformers_with_our_logits_generate_and_tokenizer(runs, name, tmp_path):
    from transformers import AutoTokenizer

    from clustertrain.hf import export_checkpoint

    out = tmp_path / "hf"
    result = export_checkpoint(runs[name], out)
    assert result.step == 20 and result.hf_class == LAYOUTS[name][2] and result.shards == 1
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "generation_config.json", "model.safetensors",
                                                     "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # the temp directory was renamed
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [LAYOUTS[name][2]]
    model, tokenizer = ours(runs[name], tmp_path)
    batch = torch.randint(0, tokenizer.vocab_size, (3, 32), generator=torch.Generator().manual_seed(1))
    hf = hf_logits_match(out, model, batch)

    prompt = torch.tensor([tokenizer.encode("to be or ")])
    with torch.no_grad():
        generated = hf.generate(prompt, max_new_tokens=6, min_new_tokens=6, do_sample=False)
        assert generated.shape == (1, prompt.shape[1] + 6)
        assert generated.tolist() == greedy(model, prompt, 6, tokenizer.eod).tolist()

    tok = AutoTokenizer.from_pretrained(out)
    assert tok.encode(TEXT) == tokenizer.encode(TEXT)
    assert tok.eos_token_id == tokenizer.eod == config["eos_token_id"]
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == tokenizer.eod


def test_a_tiny_shard_size_gives_several_files_transformers_loads(runs, tmp_path):
    from safetensors.torch import load_file

    from clustertrain.hf import export_checkpoint

    out = tmp_path / "sharded"
    result = export_checkpoint(runs["fsdp"], out, step=10, max_shard_size="40KB", read_bytes=30_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(p.name for p in out.glob("model-*.safetensors"))
    assert result.shards == len(files) > 2 and not (out / "model.safetensors").exists()
    assert files == [f"model-{k:05d}-of-{len(files):05d}.safetensors" for k in range(1, len(files) + 1)]
    assert sorted(set(index["weight_map"].values())) == files
    assert index["metadata"]["total_size"] == sum(t.numel() * 4 for f in files for t in load_file(out / f).values())
    model, _ = ours(runs["fsdp"], tmp_path, step=10)
    hf_logits_match(out, model, torch.randint(0, 258, (2, 32), generator=torch.Generator().manual_seed(2)))


def test_bfloat16_export_is_the_rounded_master_weights(runs, tmp_path):
    from safetensors.torch import load_file

    from clustertrain.hf import export_checkpoint

    export_checkpoint(runs["tp"], tmp_path / "f32")
    export_checkpoint(runs["tp"], tmp_path / "bf16", dtype="bfloat16")
    full, half = load_file(tmp_path / "f32" / "model.safetensors"), load_file(tmp_path / "bf16" / "model.safetensors")
    assert full.keys() == half.keys()
    assert all(half[k].dtype == torch.bfloat16 and torch.equal(half[k], full[k].to(torch.bfloat16)) for k in full)
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["torch_dtype"] == "bfloat16"


# -- the command line: bad input is one line, exit 2, nothing written ------------------------------


def cli(*args: str):
    from typer.testing import CliRunner

    from clustertrain.cli import app

    return CliRunner().invoke(app, ["export", *args])


def errors(res) -> list[str]:
    return [line for line in res.output.splitlines() if line.startswith("error:")]


def test_the_command_exports_a_project_model(runs, tmp_path):
    out = tmp_path / "cli"
    res = cli(str(runs["_project"]), "--model", "pp", "--step", "10", "-o", str(out))
    assert res.exit_code == 0, res.output
    assert "GPT2LMHeadModel, pp step 10" in res.output and (out / "model.safetensors").is_file()
    res = cli(str(runs["_project"]), "-o", str(tmp_path / "other"))
    assert res.exit_code == 2 and len(errors(res)) == 1 and "choose one with --model (ddp, fsdp, tp, pp)" in res.output


def assert_refused(res, *words: str, parent: Path) -> None:
    assert res.exit_code == 2, res.output
    assert len(errors(res)) == 1, res.output
    for w in words:
        assert w in errors(res)[0], res.output
    assert not [p for p in parent.iterdir() if p.name.startswith(".")], "a temporary directory was left behind"


def test_bad_inputs_are_one_line_and_write_nothing(runs, tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    (full / "mine.txt").write_text("keep")
    res = cli(str(runs["ddp"]), "-o", str(full))
    assert_refused(res, str(full), "not an empty directory", parent=tmp_path)
    assert [p.name for p in full.iterdir()] == ["mine.txt"]

    out = tmp_path / "out"
    res = cli(str(runs["ddp"]), "--step", "7", "-o", str(out))
    assert_refused(res, "--step 7", "it has steps 10, 20", parent=tmp_path)
    assert not out.exists()

    nockpt = tmp_path / "nockpt"
    shutil.copytree(runs["ddp"], nockpt, ignore=shutil.ignore_patterns("checkpoints"))
    assert_refused(cli(str(nockpt), "-o", str(out)), str(nockpt), "no complete checkpoint", parent=tmp_path)

    nohf = tmp_path / "nohf"
    shutil.copytree(runs["ddp"], nohf)
    config = yaml.safe_load((nohf / "config.yaml").read_text())
    next(m for m in config["models"] if m["name"] == "ddp")["model"]["norm"] = "rmsnorm"  # learned positions with RMSNorm: no Hugging Face class
    (nohf / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    assert_refused(cli(str(nohf), "-o", str(out)), "models.ddp.model.norm", "rmsnorm", parent=tmp_path)

    assert_refused(cli(str(runs["ddp"]), "--dtype", "float16", "-o", str(out)), "--dtype float16", parent=tmp_path)
    assert_refused(cli(str(tmp_path / "nowhere"), "-o", str(out)), "neither a run directory", parent=tmp_path)
    assert not out.exists()


# -- --to: published with a checksum manifest, fetched back verified -------------------------------


@pytest.fixture
def s3(tmp_path):
    import uuid

    import boto3

    from tests.support.s3server import dummy_environ, s3_server

    with dummy_environ(), s3_server() as endpoint:
        bucket = f"ct-{uuid.uuid4().hex[:12]}"
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
        yield endpoint, bucket


def test_to_s3_publishes_with_a_manifest_and_fetches_back_verified(runs, s3, tmp_path):
    import boto3

    from clustertrain.storage import MANIFEST_NAME, StoreConfig, restore_directory

    endpoint, bucket = s3
    out, url = tmp_path / "pub", f"s3://{bucket}/models/llama-tp/"
    res = cli(str(runs["tp"]), "-o", str(out), "--to", url, "--endpoint-url", endpoint)
    assert res.exit_code == 0, res.output
    assert f"published to {url} (verified)" in res.output
    keys = {o["Key"] for o in boto3.client("s3", endpoint_url=endpoint).list_objects_v2(Bucket=bucket)["Contents"]}
    assert keys == {f"models/llama-tp/{p.name}" for p in out.iterdir()} | {f"models/llama-tp/{MANIFEST_NAME}"}
    assert not list(out.glob(".clustertrain-*"))  # the hash cache stayed out of the exported directory
    back = tmp_path / "back"
    restore_directory(url, back, options=StoreConfig(endpoint_url=endpoint))
    for p in out.iterdir():
        assert (back / p.name).read_bytes() == p.read_bytes()
    model, _ = ours(runs["tp"], tmp_path)
    hf_logits_match(back, model, torch.randint(0, 258, (2, 32), generator=torch.Generator().manual_seed(3)))
