"""The pieces of an exported Hugging Face directory, against the libraries that read them: safetensors files written
tensor by tensor load with ``safetensors``; the shard split is huggingface_hub's; the tokenizer files load with
``AutoTokenizer`` and encode like ours (byte and BPE)."""

from __future__ import annotations

import json

import pytest
import torch

from clustertrain.hf.safetensors_files import (SafetensorsWriter, TensorSpec, index_json, parse_size, shard_names,
                                               split_shards)
from clustertrain.hf.tokenizer_files import bytes_to_unicode, write_tokenizer_files

TEXT = "Héllo wörld — 日本語 🙂\n\tend  of line\r\n0123 ~!@#$%^&*()"


def test_safetensors_written_tensor_by_tensor_load_with_the_library(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import load_file

    gen = torch.Generator().manual_seed(0)
    tensors = {"a.weight": torch.randn(3, 5, generator=gen), "b": torch.randn(7, generator=gen).to(torch.bfloat16),
               "c.weight": torch.randn(2, 2, 2, generator=gen)}
    specs = [TensorSpec(k, str(v.dtype).removeprefix("torch."), tuple(v.shape)) for k, v in tensors.items()]
    writer = SafetensorsWriter(tmp_path / "m.safetensors", specs)
    for k, v in tensors.items():
        assert not writer.done
        writer.write(k, v)
    assert writer.done
    loaded = load_file(tmp_path / "m.safetensors")
    assert loaded.keys() == tensors.keys()
    for k, v in tensors.items():
        assert loaded[k].dtype == v.dtype and torch.equal(loaded[k], v)
    with safe_open(tmp_path / "m.safetensors", framework="pt") as f:
        assert f.metadata() == {"format": "pt"}  # what transformers' save_pretrained writes
    header_len = int.from_bytes((tmp_path / "m.safetensors").read_bytes()[:8], "little")
    assert header_len % 8 == 0


def test_writing_out_of_order_is_caught(tmp_path):
    writer = SafetensorsWriter(tmp_path / "m.safetensors", [TensorSpec("a", "float32", (2,))])
    with pytest.raises(AssertionError):
        writer.write("a", torch.zeros(3))
    writer.close()


@pytest.mark.parametrize("limit", [1, 100, 250, 1000, "1KB", 10**9])
def test_the_shard_split_is_huggingface_hubs(limit):
    from huggingface_hub.serialization import split_torch_state_dict_into_shards

    sizes = [(f"t{i}", n) for i, n in enumerate([10, 60, 60, 20, 600, 5, 200, 200, 1, 90])]
    specs = [TensorSpec(name, "float32", (n,)) for name, n in sizes]
    theirs = split_torch_state_dict_into_shards({name: torch.zeros(n) for name, n in sizes},
                                                filename_pattern="model{suffix}.safetensors", max_shard_size=limit)
    ours = split_shards(specs, limit)
    names = shard_names(len(ours))
    assert {names[k]: [s.name for s in shard] for k, shard in enumerate(ours)} == theirs.filename_to_tensors
    index = index_json(ours)
    if theirs.is_sharded:
        assert index == {"metadata": theirs.metadata, "weight_map": theirs.tensor_to_filename}
    else:
        assert index is None and names == ["model.safetensors"]


def test_shard_sizes_parse_as_transformers_reads_them():
    from huggingface_hub.serialization._base import parse_size_to_int

    for text in ("50GB", "5MB", "1.5KB", " 2 TB "):
        assert parse_size(text) == parse_size_to_int(text)
    for bad in ("50", "5 GiB", "-1GB", "0KB", 0):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_the_byte_table_is_the_byte_level_alphabet():
    from tokenizers import pre_tokenizers

    table = bytes_to_unicode()
    assert sorted(table) == list(range(256)) and len(set(table.values())) == 256
    assert set(table.values()) == set(pre_tokenizers.ByteLevel.alphabet())


def test_the_byte_tokenizer_loads_with_autotokenizer_and_encodes_like_ours(tmp_path):
    from transformers import AutoTokenizer

    from clustertrain.data.tokenizers import ByteTokenizer

    ids = write_tokenizer_files("byte", tmp_path)
    ours = ByteTokenizer()
    assert (ids.eos, ids.bos, ids.pad) == (ours.eod, ours.eod, ours.pad)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    every_char = "".join(map(chr, range(1, 0x800))) + TEXT  # one to three UTF-8 bytes per character
    assert tok.encode(every_char) == ours.encode(every_char)
    assert tok.encode(TEXT) == ours.encode(TEXT)
    assert tok.decode(ours.encode(TEXT)) == TEXT
    assert (tok.eos_token_id, tok.bos_token_id, tok.pad_token_id) == (256, 256, 257)
    assert len(tok) == ours.vocab_size
    assert json.loads((tmp_path / "special_tokens_map.json").read_text()) == {
        "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|pad|>"}


def test_a_tokenizer_json_is_copied_as_it_is_and_encodes_like_ours(tmp_path):
    from transformers import AutoTokenizer

    from clustertrain.data.tokenizers import HFTokenizer, train_tokenizer

    corpus = tmp_path / "c.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog\n" * 50 + TEXT)
    trained = train_tokenizer([corpus], 300, tmp_path / "tok" / "tokenizer.json")
    out = tmp_path / "out"
    out.mkdir()
    ids = write_tokenizer_files(str(trained.path), out)
    assert (out / "tokenizer.json").read_bytes() == trained.path.read_bytes()
    assert HFTokenizer(out / "tokenizer.json").identity == trained.identity
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.encode(TEXT) == trained.encode(TEXT)
    assert tok.eos_token_id == trained.eod == ids.eos
    assert tok.pad_token_id == ids.pad is not None
