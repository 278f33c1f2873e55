"""Tokenizer specs: byte, Hugging Face tokenizer.json files (local only), training a byte-level BPE."""

from __future__ import annotations

import json

import pytest

from clustertrain.data.tokenizers import ByteTokenizer, HFTokenizer, load_tokenizer, train_tokenizer
from clustertrain.core.errors import ConfigError


def test_byte_tokenizer_round_trip():
    tok = load_tokenizer("byte")
    assert isinstance(tok, ByteTokenizer) and tok.vocab_size == 258 and tok.eod == 256
    assert tok.decode(tok.encode("héllo") + [tok.eod]) == "héllo"


@pytest.fixture(scope="module")
def trained(tmp_path_factory, shakespeare_lines):
    root = tmp_path_factory.mktemp("tok")
    (root / "c.jsonl").write_text("\n".join(shakespeare_lines[:40]) + "\n")
    return root, train_tokenizer([root / "c.jsonl"], 600, root / "out" / "tokenizer.json")


def test_trained_bpe_loads_by_both_specs(trained):
    root, tok = trained
    path = root / "out" / "tokenizer.json"
    for spec in (f"hf:{path}", str(path)):
        loaded = load_tokenizer(spec)
        assert isinstance(loaded, HFTokenizer) and loaded.identity == tok.identity
    assert tok.vocab_size == 600 and tok.eod == 0  # <|endoftext|> is the first special token
    text = "To be, or not to be: that is the question.\nWhére?"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert len(ids) < len(text.encode()), "BPE merges shorten the text"
    assert all(0 <= i < tok.vocab_size for i in ids)


def test_identity_is_the_file_hash(trained, tmp_path):
    root, tok = trained
    data = json.loads((root / "out" / "tokenizer.json").read_text())
    data["added_tokens"][1]["content"] = "<|pad2|>"
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    assert load_tokenizer(str(tmp_path / "tokenizer.json")).identity != tok.identity


def test_bad_specs_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="unknown tokenizer 'gpt2'; valid: byte, hf:"):
        load_tokenizer("gpt2")  # a hub name is never downloaded
    with pytest.raises(ConfigError, match="does not exist"):
        load_tokenizer(f"hf:{tmp_path}/missing.json")
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ConfigError, match="is not a valid tokenizer.json"):
        load_tokenizer(str(tmp_path / "tokenizer.json"))
    with pytest.raises(ConfigError, match="at least 258"):
        train_tokenizer([tmp_path / "tokenizer.json"], 100, tmp_path / "x.json")


def test_tokenizer_without_eod_is_rejected(tmp_path):
    from tokenizers import Tokenizer, models

    Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")).save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(ConfigError, match="has no end-of-document token"):
        load_tokenizer(str(tmp_path / "tokenizer.json"))


def test_loading_the_byte_tokenizer_needs_no_numpy():
    """`plan` and `check` load tokenizers (vocabulary checks) and must not pay for numpy."""
    import subprocess
    import sys

    code = ("import sys\nfrom clustertrain.data import load_tokenizer\n"
            "tok = load_tokenizer('byte')\nassert tok.encode('ab') == [97, 98] and tok.vocab_size == 258\n"
            "print('numpy' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"
