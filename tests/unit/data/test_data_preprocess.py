"""prepare_dataset on real small corpora: formats, bad input, skipping, manifest, re-runs."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from clustertrain.data.indexed import IndexedDataset
from clustertrain.data.preprocess import prepare_dataset, read_manifest
from clustertrain.data.tokenizers import ByteTokenizer, train_tokenizer
from clustertrain.core.errors import DataError


def test_jsonl_documents_and_manifest(tmp_path, write_jsonl):
    src = write_jsonl(tmp_path / "a.jsonl", ["hello", "", "wörld"])
    (tmp_path / "a.jsonl").write_text((tmp_path / "a.jsonl").read_text() + "\n\n")  # blank lines are ignored
    res = prepare_dataset(src, tmp_path / "out", "byte")
    ds = IndexedDataset(tmp_path / "out")
    assert ds.n_documents == 3 and len(ds) == 2  # the empty document has no sequence (as Megatron's preprocess)
    assert bytes(ds.document(0)[:-1].astype(np.uint8)) == b"hello" and ds.document(0)[-1] == 256
    assert len(ds.document(1)) == 0
    assert bytes(ds.document(2)[:-1].astype(np.uint8)).decode() == "wörld"
    m = read_manifest(tmp_path / "out")
    assert m == res.manifest and not res.reused
    assert (m["documents"], m["sequences"], m["tokens"], m["dtype"], m["tokenizer"]) == (3, 2, 13, "uint16", "byte-v1")
    assert m["sources"][0]["bytes"] == src.stat().st_size and m["sources"][0]["path"] == str(src.resolve())
    assert len(m["bin"]["sha256"]) == 64 and m["idx"]["bytes"] == (tmp_path / "out.idx").stat().st_size


def test_text_files_are_one_document_each_and_gz_works(tmp_path, shakespeare_lines):
    (tmp_path / "a.txt").write_text("para one\n\npara two\n")
    (tmp_path / "b.txt").write_text("second file")
    with gzip.open(tmp_path / "c.jsonl.gz", "wt") as f:
        f.write("\n".join(shakespeare_lines[:5]) + "\n")
    prepare_dataset([tmp_path / "*.txt", tmp_path / "c.jsonl.gz"], tmp_path / "o", "byte", append_eod=False)
    ds = IndexedDataset(tmp_path / "o")
    assert ds.n_documents == 7
    assert bytes(ds.document(0).astype(np.uint8)) == b"para one\n\npara two\n"
    assert bytes(ds.document(1).astype(np.uint8)) == b"second file"
    assert bytes(ds.document(6).astype(np.uint8)).decode() == json.loads(shakespeare_lines[4])["text"]


def test_workers_give_identical_output(tmp_path, shakespeare_lines):
    src = tmp_path / "s.jsonl"
    src.write_text("\n".join(shakespeare_lines * 2) + "\n")
    prepare_dataset(src, tmp_path / "one", "byte", workers=1)
    prepare_dataset(src, tmp_path / "two", "byte", workers=2)
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"one{ext}").read_bytes() == (tmp_path / f"two{ext}").read_bytes()


@pytest.mark.parametrize("content,match", [
    (b'{"text": "ok"}\n{"text": "cut\n', r"b\.jsonl:2: not valid JSON"),
    (b'{"text": "ok"}\n{"body": "x"}\n', r"b\.jsonl:2: no key 'text' \(found: body\); set --json-key"),
    (b'{"text": 5}\n', r"b\.jsonl:1: 'text' holds a int, not a string"),
    (b'{"text": "ok"}\n{"text": "\xff\xfe"}\n', r"b\.jsonl:2: not UTF-8 at byte offset 25"),
    (b"", r"b\.jsonl: no documents found; give non-empty input files"),
    (b"\n\n", r"b\.jsonl: no documents found"),
])
def test_bad_jsonl_is_one_line_error_naming_the_line(tmp_path, content, match):
    (tmp_path / "b.jsonl").write_bytes(content)
    with pytest.raises(DataError, match=match) as err:
        prepare_dataset(tmp_path / "b.jsonl", tmp_path / "out", "byte")
    assert "\n" not in str(err.value)
    assert not list(tmp_path.glob("out*")), "nothing half-written"


def test_non_utf8_text_file_and_missing_input(tmp_path):
    (tmp_path / "t.txt").write_bytes(b"abc\xffdef")
    with pytest.raises(DataError, match=r"t\.txt: not UTF-8 text at byte offset 3"):
        prepare_dataset(tmp_path / "t.txt", tmp_path / "o", "byte")
    with pytest.raises(DataError, match=r"nope\*\.jsonl: no such file"):
        prepare_dataset(tmp_path / "nope*.jsonl", tmp_path / "o", "byte")


def test_skip_bad_lines_counts(tmp_path):
    lines = [b'{"text": "a"}', b"garbage", b'{"other": 1}', b'{"text": "\xff"}', b'{"text": "bc"}']
    (tmp_path / "b.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    res = prepare_dataset(tmp_path / "b.jsonl", tmp_path / "o", "byte", skip_bad_lines=True)
    assert res.skipped_lines == 3 and res.manifest["documents"] == 2
    assert res.manifest["first_skipped"][0].startswith(f"{tmp_path / 'b.jsonl'}:2:")
    (tmp_path / "all-bad.jsonl").write_bytes(b"x\ny\n")
    with pytest.raises(DataError, match=r"no documents found \(2 bad lines skipped\)"):
        prepare_dataset(tmp_path / "all-bad.jsonl", tmp_path / "o2", "byte", skip_bad_lines=True)


def test_rerun_does_nothing_until_inputs_or_tokenizer_change(tmp_path, shakespeare_lines):
    src = tmp_path / "s.jsonl"
    src.write_text("\n".join(shakespeare_lines[:20]) + "\n")
    first = prepare_dataset(src, tmp_path / "o", "byte")
    stamp = (tmp_path / "o.bin").stat().st_mtime_ns, (tmp_path / "o.manifest.json").stat().st_mtime_ns
    again = prepare_dataset(src, tmp_path / "o", ByteTokenizer())
    assert again.reused and again.manifest == first.manifest
    assert ((tmp_path / "o.bin").stat().st_mtime_ns, (tmp_path / "o.manifest.json").stat().st_mtime_ns) == stamp
    tok = train_tokenizer([src], 300, tmp_path / "tok" / "tokenizer.json")
    other = prepare_dataset(src, tmp_path / "o", str(tmp_path / "tok" / "tokenizer.json"))
    assert not other.reused and other.manifest["tokenizer"] == tok.identity
    src.write_text("\n".join(shakespeare_lines[:21]) + "\n")
    changed = prepare_dataset(src, tmp_path / "o", str(tmp_path / "tok" / "tokenizer.json"))
    assert not changed.reused and changed.manifest["documents"] == 21
    (tmp_path / "o.bin").write_bytes(b"")  # a damaged output is rebuilt, not trusted
    assert not prepare_dataset(src, tmp_path / "o", str(tmp_path / "tok" / "tokenizer.json")).reused


def test_progress_bar_on_a_console(tmp_path, shakespeare_lines):
    from io import StringIO

    from rich.console import Console

    src = tmp_path / "s.jsonl"
    src.write_text("\n".join(shakespeare_lines) + "\n")
    buf = StringIO()
    prepare_dataset(src, tmp_path / "o", "byte", console=Console(file=buf, force_terminal=True, width=150))
    text = buf.getvalue()
    assert f"{len(shakespeare_lines)} documents" in text and "100%" in text and "/s" in text
