"""The tokenizer directory Megatron-LM loads is the tokenizer clustertrain prepared the data with.

A ``framework: megatron`` model renders ``--tokenizer-type HuggingFaceTokenizer --tokenizer-model <dir of
tokenizer.json>`` (or ``NullTokenizer --vocab-size 256`` for ``byte``); Megatron's HuggingFaceTokenizer calls
``transformers.AutoTokenizer.from_pretrained(dir)``. These tests load the directory that ``train_tokenizer`` /
``write_tokenizer_config`` leave with the real transformers and the real megatron-core tokenizer builder
(``megatron/core/tokenizers/text/utils/build_tokenizer.py``, fed the options clustertrain renders) and compare
ids, vocabulary size and end-of-document id with :class:`~clustertrain.data.tokenizers.HFTokenizer`'s.

transformers is in the ``test`` extra; without it the tests that need it are skipped, saying so.
"""

from __future__ import annotations

import argparse
import json
import shutil
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from clustertrain.cli import app
from clustertrain.data.fastbpe import HARD_CASES
from clustertrain.data.tokenizers import (
    MODEL_MAX_LENGTH, ByteTokenizer, HFTokenizer, train_tokenizer, write_tokenizer_config,
)
from clustertrain.core.errors import ConfigError
from clustertrain.megatron.args import MegatronContext, megatron_args
from clustertrain.project import validate_project

TEXTS = [
    "To be, or not to be: that is the question.",
    "  Whére is\tthe 東京 station?\n\nSecond paragraph — with an em dash, 3.14159 and émojis 🙂.",
    "KING HENRY: Once more unto the breach, dear friends, once more;",
]
NO_TRANSFORMERS = "transformers is not installed (pip install -e '.[test]'); Megatron's HuggingFaceTokenizer needs it"

#: Megatron-LM's parser defaults (megatron/training/arguments.py at core_v0.16.1) for the tokenizer options that
#: clustertrain does not render; test_megatron_parser_defaults_are_the_ones_assumed checks them against the parser
PARSER_DEFAULTS = {"vocab_file": None, "merge_file": None, "tokenizer_special_tokens": None,
                   "tokenizer_hf_use_fast": False, "trust_remote_code": False,
                   "tokenizer_hf_include_special_tokens": False, "tokenizer_metadata": None, "legacy_tokenizer": False}


@pytest.fixture(scope="module")
def trained(tmp_path_factory, shakespeare_lines) -> tuple[Path, HFTokenizer]:
    root = tmp_path_factory.mktemp("megatron-tok")
    (root / "c.jsonl").write_text("\n".join(shakespeare_lines[:300]) + "\n")
    tok = train_tokenizer([root / "c.jsonl"], 700, root / "tok" / "tokenizer.json")
    return root / "tok", tok


def _project(tokenizer: str):
    return validate_project({
        "name": "mg", "cluster": {"backend": "slurm", "nodes": 1, "gpus_per_node": 8, "instance_type": "p5.48xlarge"},
        "storage": {"root": "/fsx"},
        "models": [{"name": "m", "framework": "megatron", "model": {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 64},
                    "data": {"source": "/fsx/data/web/web", "tokenizer": tokenizer},
                    "training": {"max_steps": 10, "micro_batch": 1, "global_batch": 8}}]})


def rendered(tokenizer: str) -> list[str]:
    """The pretrain_gpt.py arguments clustertrain renders for a model with this ``data.tokenizer``."""
    project = _project(tokenizer)
    entry = project.models[0]
    ctx = MegatronContext(project, entry, 8, Path("/fsx/runs/m"), ((1.0, Path("/fsx/data/web/web")),))
    return megatron_args(ctx)


def _option(args: list[str], option: str) -> str | None:
    return args[args.index(option) + 1] if option in args else None


def megatron_namespace(args: list[str]) -> argparse.Namespace:
    """The tokenizer part of the namespace Megatron's parser makes of ``args``."""
    vocab = _option(args, "--vocab-size")
    return argparse.Namespace(**PARSER_DEFAULTS, tokenizer_type=_option(args, "--tokenizer-type"),
                              tokenizer_model=_option(args, "--tokenizer-model"),
                              vocab_size=int(vocab) if vocab is not None else None)


def build_megatron_tokenizer(ns: argparse.Namespace):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.tokenizers.text.utils.build_tokenizer import build_tokenizer
        return build_tokenizer(ns)


# ----- the file ----------------------------------------------------------------------------------------------


def test_train_tokenizer_writes_the_config_megatron_needs(trained):
    directory, tok = trained
    config = json.loads((directory / "tokenizer_config.json").read_text())
    assert config == {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
                      "bos_token": "<|endoftext|>", "model_max_length": MODEL_MAX_LENGTH,
                      "clean_up_tokenization_spaces": False}
    assert tok.eod_token == "<|endoftext|>" and tok.eod == 0
    assert sorted(p.name for p in directory.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]  # no temp files


def test_write_tokenizer_config_on_a_bare_tokenizer_json_then_leaves_it(trained, tmp_path):
    directory, _ = trained
    shutil.copy(directory / "tokenizer.json", tmp_path / "tokenizer.json")
    written = write_tokenizer_config(tmp_path / "tokenizer.json")
    assert written == tmp_path / "tokenizer_config.json"
    assert written.read_bytes() == (directory / "tokenizer_config.json").read_bytes()
    stamp = written.stat().st_mtime_ns
    assert write_tokenizer_config(tmp_path / "tokenizer.json") == written  # the same content: not rewritten
    assert written.stat().st_mtime_ns == stamp


def test_the_eos_is_the_end_of_document_token_hftokenizer_finds(tmp_path):
    from tokenizers import Tokenizer, models

    vocab = {"a": 0, "b": 1, "[UNK]": 2, "</s>": 3, "[SEP]": 4}  # "</s>" comes before "[SEP]" in EOD_CANDIDATES
    Tokenizer(models.WordLevel(vocab, unk_token="[UNK]")).save(str(tmp_path / "tokenizer.json"))
    config = json.loads(write_tokenizer_config(tmp_path / "tokenizer.json").read_text())
    assert config["eos_token"] == config["bos_token"] == "</s>"
    assert HFTokenizer(tmp_path / "tokenizer.json").eod == 3


def test_a_different_config_is_never_overwritten(trained, tmp_path):
    directory, _ = trained
    shutil.copy(directory / "tokenizer.json", tmp_path / "tokenizer.json")
    theirs = '{"tokenizer_class": "GPT2TokenizerFast", "eos_token": "<|endoftext|>"}\n'
    (tmp_path / "tokenizer_config.json").write_text(theirs)
    with pytest.raises(ConfigError, match=r"tokenizer_config.json already exists and differs .* left as it is"):
        write_tokenizer_config(tmp_path / "tokenizer.json")
    assert (tmp_path / "tokenizer_config.json").read_text() == theirs
    # training into that directory stops before anything is written (the old tokenizer.json stays too)
    before = (tmp_path / "tokenizer.json").read_bytes()
    (tmp_path / "c.txt").write_text("completely different words here")
    with pytest.raises(ConfigError, match="already exists and differs"):
        train_tokenizer([tmp_path / "c.txt"], 300, tmp_path / "tokenizer.json")
    assert (tmp_path / "tokenizer.json").read_bytes() == before
    assert (tmp_path / "tokenizer_config.json").read_text() == theirs


def test_a_file_not_named_tokenizer_json_is_refused(trained, tmp_path):
    directory, _ = trained
    shutil.copy(directory / "tokenizer.json", tmp_path / "bpe.json")
    with pytest.raises(ConfigError, match="reads a directory's tokenizer.json; rename the file to .*/tokenizer.json"):
        write_tokenizer_config(tmp_path / "bpe.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bpe.json"]


def test_cli_tokenizer_config(trained, tmp_path):
    """The command the framework check names as the fix (clustertrain/megatron/rules.py)."""
    directory, tok = trained
    shutil.copy(directory / "tokenizer.json", tmp_path / "tokenizer.json")
    runner = CliRunner()
    r = runner.invoke(app, ["data", "tokenizer-config", str(tmp_path / "tokenizer.json")])
    assert r.exit_code == 0, r.output
    assert f"{tmp_path / 'tokenizer_config.json'}: written" in r.stdout and f"(id {tok.eod})" in r.stdout
    r = runner.invoke(app, ["data", "tokenizer-config", str(tmp_path)])  # the directory works too
    assert r.exit_code == 0 and "already up to date, nothing done" in r.stdout, r.output
    r = runner.invoke(app, ["data", "tokenizer-config", str(tmp_path / "nope" / "tokenizer.json")])
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [f"error: {tmp_path / 'nope' / 'tokenizer.json'} does not exist; give the path of a "
                                     "tokenizer.json (train one with `clustertrain data train-tokenizer`)"]


def test_the_framework_check_passes_once_the_config_is_there(trained, tmp_path):
    from clustertrain.megatron.rules import tokenizer_findings

    directory, _ = trained
    shutil.copy(directory / "tokenizer.json", tmp_path / "tokenizer.json")
    entry = _project(str(tmp_path / "tokenizer.json")).models[0]
    [finding] = tokenizer_findings("models[0]", entry)
    assert "has no tokenizer_config.json" in finding.message and "clustertrain data tokenizer-config" in finding.fix
    write_tokenizer_config(tmp_path / "tokenizer.json")
    assert tokenizer_findings("models[0]", entry) == []


# ----- what transformers and Megatron make of it ---------------------------------------------------------------


def test_a_directory_with_tokenizer_json_alone_is_not_enough(trained, tmp_path):
    """transformers 4.x refuses it (no config.json to tell the class); 5.x loads it without an eos, so Megatron's
    ``tokenizer.eod`` would be None."""
    transformers = pytest.importorskip("transformers", reason=NO_TRANSFORMERS)
    directory, _ = trained
    shutil.copy(directory / "tokenizer.json", tmp_path / "tokenizer.json")
    try:
        loaded = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    except (ValueError, OSError) as e:  # 4.x: "Unrecognized model in ... config.json"
        assert "config.json" in str(e)
        return
    assert loaded.eos_token_id is None


@pytest.mark.parametrize("use_fast", [False, True])  # Megatron passes --tokenizer-hf-use-fast (default False)
def test_autotokenizer_loads_the_directory_with_our_ids(trained, use_fast):
    transformers = pytest.importorskip("transformers", reason=NO_TRANSFORMERS)
    directory, tok = trained
    loaded = transformers.AutoTokenizer.from_pretrained(str(directory), use_fast=use_fast)
    assert loaded.eos_token_id == tok.eod and loaded.bos_token_id == tok.eod
    assert len(loaded) == tok.vocab_size
    for text in TEXTS:
        ids = tok.encode(text)
        assert loaded(text).input_ids == ids  # what Megatron's legacy HuggingFaceTokenizer.tokenize calls
        assert loaded.decode(ids) == text == tok.decode(ids)


def test_megatron_core_builds_the_same_tokenizer_from_the_rendered_options(trained):
    pytest.importorskip("transformers", reason=NO_TRANSFORMERS)
    directory, tok = trained
    args = rendered(str(directory / "tokenizer.json"))
    assert _option(args, "--tokenizer-type") == "HuggingFaceTokenizer"
    assert _option(args, "--tokenizer-model") == str(directory) and "--vocab-size" not in args
    megatron = build_megatron_tokenizer(megatron_namespace(args))
    assert megatron.vocab_size == tok.vocab_size
    assert megatron.eod == tok.eod
    for text in TEXTS:
        assert megatron.tokenize(text) == tok.encode(text)
        assert megatron.detokenize(tok.encode(text)) == text
    # tools/preprocess_data.py encodes each document with this tokenize(): the ids data prepare writes, hard cases too
    for text in HARD_CASES:
        assert megatron.tokenize(text) == tok.encode(text), repr(text[:40])


def test_megatron_core_wrapper_from_pretrained_directly(trained):
    pytest.importorskip("transformers", reason=NO_TRANSFORMERS)
    directory, tok = trained
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.tokenizers import MegatronTokenizer

        megatron = MegatronTokenizer.from_pretrained(tokenizer_path=str(directory), metadata_path={"library": "huggingface"})
    assert (megatron.vocab_size, megatron.eod) == (tok.vocab_size, tok.eod)
    assert megatron.tokenize(TEXTS[1]) == tok.encode(TEXTS[1])


def test_byte_becomes_megatrons_null_tokenizer_with_our_eod():
    args = rendered("byte")
    assert (_option(args, "--tokenizer-type"), _option(args, "--vocab-size")) == ("NullTokenizer", "256")
    assert "--tokenizer-model" not in args
    null = build_megatron_tokenizer(megatron_namespace(args))
    assert null.eod == 256 == ByteTokenizer().eod
    # Megatron's null tokenizer counts the eod in its size (257); the pad id 257 of ours is never in prepared data,
    # and Megatron pads the embedding to a multiple of 128 x tp (384) either way
    assert null.vocab_size == 257


@pytest.mark.slow
def test_megatron_parser_defaults_are_the_ones_assumed(trained, tmp_path_factory):
    """Megatron-LM's own parse_args (the tarball at the pinned tag) on the rendered lists gives the namespace values
    the tests above build by hand."""
    from tests.support.megatron_lm import megatron_source, parse_with_megatron

    directory, _ = trained
    source = megatron_source(tmp_path_factory.mktemp("megatron-lm"))
    keys = [*PARSER_DEFAULTS, "tokenizer_type", "tokenizer_model", "vocab_size"]
    lists = [rendered(str(directory / "tokenizer.json")), rendered("byte")]
    results = parse_with_megatron(source, [{"args": a, "world": 8, "read": keys} for a in lists])
    for args, result in zip(lists, results):
        assert result.accepted, result.error
        assert result.values == vars(megatron_namespace(args))
