"""The fast BPE encoder (gigatoken) gives byte-identical datasets to Hugging Face ``tokenizers``, or is not used.

Each exactness test prepares the same corpus twice, with ``encoder="auto"`` (asserted to have chosen gigatoken, so
the comparison is not vacuous) and ``encoder="reference"`` (``tokenizers``), and compares the sha256 of ``.bin`` and
``.idx``. The hard-case corpus is also compared with megatron-core's own ``IndexedDatasetBuilder``, fed
``tokenizers`` ids the way Megatron-LM's classic ``tools/preprocess_data.py`` feeds them (a document that encodes to
nothing adds no sequence and no eod). The fallback tests use tokenizers gigatoken cannot reproduce: one it refuses
to load (NFKC, Metaspace), and one it loads but encodes differently (an added token marked ``single_word``), which
only the verification sample catches.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import warnings
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

from clustertrain.data.fastbpe import HARD_CASES, choose_encoder, verification_sample
from clustertrain.data.preprocess import prepare_dataset
from clustertrain.data.tokenizers import HFTokenizer, train_tokenizer
from clustertrain.core.errors import DataError

pytest.importorskip("gigatoken", reason="gigatoken is a dependency of clustertrain (pip install -e .)")

BUNDLED = Path(str(resources.files("clustertrain.data") / "corpus" / "shakespeare.jsonl.gz"))
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def both_ways(inputs, tok: Path, out: Path, workers: int = 1):
    fast = prepare_dataset(inputs, out / "fast", str(tok), workers=workers)
    ref = prepare_dataset(inputs, out / "ref", str(tok), workers=workers, encoder="reference")
    return fast, ref


def assert_identical(out: Path) -> None:
    for ext in (".bin", ".idx"):
        assert sha(out / f"fast{ext}") == sha(out / f"ref{ext}"), f"{ext} differs between gigatoken and tokenizers"


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A byte-level BPE trained by clustertrain's own train_tokenizer (what `data train-tokenizer` writes)."""
    root = tmp_path_factory.mktemp("tok")
    return train_tokenizer([BUNDLED], 2000, root / "tokenizer.json").path


def hard_corpus(path: Path, tokenizer_json: Path) -> Path:
    """Every hard case, the added tokens in context, empty documents, and Shakespeare between them."""
    scenes = [json.loads(line)["text"] for line in gzip.open(BUNDLED, "rt", encoding="utf-8")][:40]
    docs = verification_sample(json.loads(tokenizer_json.read_text()), [])
    mixed = [d for pair in zip(docs, scenes * 4) for d in pair] + ["", "", "x"]
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in mixed), encoding="utf-8")
    return path


def custom_tokenizer(path: Path, texts: list[str], pre=None, normalizer=None, byte_fallback: bool = False,
                     added: list[AddedToken] = ()) -> Path:
    tok = Tokenizer(models.BPE(byte_fallback=byte_fallback))
    tok.pre_tokenizer = pre if pre is not None else pre_tokenizers.ByteLevel(add_prefix_space=False)
    if normalizer is not None:
        tok.normalizer = normalizer
    alphabet = pre_tokenizers.ByteLevel.alphabet() if not byte_fallback else []
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=800, special_tokens=["<|endoftext|>"],
                                                       initial_alphabet=alphabet, show_progress=False))
    if added:
        tok.add_tokens(list(added))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tok.to_str(), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def scenes() -> list[str]:
    return [json.loads(line)["text"] for line in gzip.open(BUNDLED, "rt", encoding="utf-8")][:60]


def test_bundled_corpus_is_byte_identical(tmp_path, trained):
    fast, ref = both_ways(BUNDLED, trained, tmp_path)
    assert fast.encoder.fast and fast.encoder.name.startswith("gigatoken ")
    assert "matches tokenizers on all" in fast.encoder.reason
    assert not ref.encoder.fast and ref.encoder.name.startswith("tokenizers ")
    assert_identical(tmp_path)
    assert fast.manifest["bin"] == ref.manifest["bin"] and fast.manifest["encoder"] == fast.encoder.name
    assert fast.manifest["tokens"] > 100_000


def test_hard_cases_match_tokenizers_and_megatrons_classic_convention(tmp_path, trained, megatron):
    corpus = hard_corpus(tmp_path / "hard.jsonl", trained)
    fast, _ = both_ways(corpus, trained, tmp_path, workers=2)
    assert fast.encoder.fast
    assert_identical(tmp_path)
    # megatron-core's builder fed tokenizers' ids the way tools/preprocess_data.py feeds them
    hf = HFTokenizer(trained)
    texts = [json.loads(line)["text"] for line in corpus.read_text(encoding="utf-8").splitlines()]
    assert texts.count("") >= 3 and any(len(t) >= 3000 for t in texts)
    builder = megatron.indexed.IndexedDatasetBuilder(str(tmp_path / "classic.bin"), dtype=np.uint16)
    for text in texts:
        ids = hf.encode(text)
        if ids:
            ids.append(hf.eod)
        builder.add_document(ids, [len(ids)] if ids else [])
    builder.finalize(str(tmp_path / "classic.idx"))
    for ext in (".bin", ".idx"):
        assert sha(tmp_path / f"fast{ext}") == sha(tmp_path / f"classic{ext}")
    assert fast.manifest["documents"] == len(texts) and fast.manifest["sequences"] < len(texts)


def test_llama3_style_split_tokenizer_is_byte_identical(tmp_path, scenes):
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_SPLIT), "isolated"),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok = custom_tokenizer(tmp_path / "l3" / "tokenizer.json", scenes, pre=pre)
    corpus = hard_corpus(tmp_path / "hard.jsonl", tok)
    fast, _ = both_ways(corpus, tok, tmp_path)
    assert fast.encoder.fast
    assert_identical(tmp_path)


@pytest.mark.parametrize("kind,reason", [
    ("nfkc", "gigatoken cannot load this tokenizer (Unsupported normalizer type: NFKC)"),
    ("metaspace", "gigatoken cannot load this tokenizer"),
    ("single_word", "gigatoken differs from tokenizers on"),
])
def test_a_tokenizer_gigatoken_does_not_reproduce_falls_back(tmp_path, scenes, kind, reason):
    if kind == "nfkc":
        tok = custom_tokenizer(tmp_path / "t" / "tokenizer.json", scenes, normalizer=normalizers.NFKC())
    elif kind == "metaspace":
        tok = custom_tokenizer(tmp_path / "t" / "tokenizer.json", scenes, pre=pre_tokenizers.Metaspace(),
                               byte_fallback=True)
    else:  # loads, but gigatoken ignores single_word: only the verification sample shows it
        tok = custom_tokenizer(tmp_path / "t" / "tokenizer.json", scenes,
                               added=[AddedToken("<tag>", single_word=True)])
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in scenes[:5]))
    fast, _ = both_ways(tmp_path / "c.jsonl", tok, tmp_path)
    assert not fast.encoder.fast and fast.encoder.name.startswith("tokenizers ")
    assert fast.encoder.reason.startswith(reason) and "\n" not in fast.encoder.reason
    assert_identical(tmp_path)


def test_the_verification_sample_has_the_hard_cases_and_the_corpus(trained):
    tj = json.loads(trained.read_text())
    sample = verification_sample(tj, ["corpus doc 1", "corpus doc 2"])
    assert "" in sample and "\x00 nul \x00\x00 \x01\x02\x1b[0m \x7f \x85 \x9f" in sample
    assert "x<|endoftext|>y" in sample and "<|pad|><|pad|>" in sample  # every added token, glued and repeated
    assert sample[-2:] == ["corpus doc 1", "corpus doc 2"]
    assert max(map(len, HARD_CASES)) >= 3000
    choice = choose_encoder(HFTokenizer(trained), ["corpus doc 1"])
    assert choice.fast and f"all {len(verification_sample(tj, ['corpus doc 1']))} verification" in choice.reason


def test_a_lone_surrogate_is_a_bad_line_for_both_encoders(tmp_path, trained):
    (tmp_path / "b.jsonl").write_text('{"text": "ok"}\n{"text": "bad \\ud800 x"}\n', encoding="utf-8")
    for encoder in ("auto", "reference"):
        with pytest.raises(DataError, match=r"b\.jsonl:2: 'text' holds a lone surrogate escape \(\\ud800\)") as e:
            prepare_dataset(tmp_path / "b.jsonl", tmp_path / "out", str(trained), encoder=encoder)
        assert "\n" not in str(e.value) and not list(tmp_path.glob("out*"))
    done = prepare_dataset(tmp_path / "b.jsonl", tmp_path / "out", str(trained), skip_bad_lines=True)
    assert done.skipped_lines == 1 and done.manifest["documents"] == 1


def test_unknown_encoder_is_refused(tmp_path, trained):
    with pytest.raises(DataError, match=r"--encoder fastest: unknown; valid: auto, reference"):
        prepare_dataset(BUNDLED, tmp_path / "out", str(trained), encoder="fastest")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert prepare_dataset(BUNDLED, tmp_path / "b", "byte").encoder.name == "byte-v1"


def test_blocks_by_reference_read_the_same_bytes_and_refuse_a_shrunk_file(tmp_path):
    from clustertrain.data.inputs import LineCounter, blocks

    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"text": f"doc {i} " * (i % 7)}) + "\n" for i in range(3000)))
    by_value = list(blocks(path, lambda _: None, 4096))
    by_ref = list(blocks(path, lambda _: None, 4096, by_reference=True))
    assert len(by_ref) > 10 and all(not b.data and b.length and b.first_line == 0 for b in by_ref)
    loaded = [b.loaded() for b in by_ref]
    assert b"".join(b.data for b in loaded) == b"".join(b.data for b in by_value) == path.read_bytes()
    assert all(b.data.endswith(b"\n") for b in loaded) and [b.offset for b in by_ref] == [
        sum(b.length for b in by_ref[:i]) for i in range(len(by_ref))]
    lines = LineCounter()  # the line numbers a by-value reader counts, found only when asked
    firsts = {b.offset: b.first_line for b in by_value}
    assert [lines.line_at(str(path), b.offset) for b in by_ref] == [
        path.read_bytes()[: b.offset].count(b"\n") + 1 for b in by_ref]
    assert all(lines.line_at(str(path), off) == first for off, first in firsts.items())
    path.write_bytes(path.read_bytes()[: by_ref[-1].offset + 10])
    with pytest.raises(DataError, match=r"c\.jsonl: the file shrank while being read"):
        by_ref[-1].loaded()
    gz = tmp_path / "c.jsonl.gz"
    gz.write_bytes(gzip.compress(b'{"text": "x"}\n' * 10))
    assert all(b.data for b in blocks(gz, lambda _: None, 64, by_reference=True))  # compressed: by value
