"""Reading JSONL input: orjson's fast path gives exactly what ``json`` gives, bad lines in blocks read by the
workers name the right line, and the workers' part files never outlive ``prepare``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from clustertrain.core.errors import DataError
from clustertrain.data import inputs
from clustertrain.data.indexed import IndexedDataset
from clustertrain.data.inputs import Block, parse_block
from clustertrain.data.preprocess import prepare_dataset

HOSTILE = [
    b'{"text": "plain"}', b'{"text": "\\ud800 lone high"}', b'{"text": "x\\udc00"}', b'{"text": "\\ud83d\\ude00"}',
    b'{"text": "a", "text": "dup"}', b'\xef\xbb\xbf{"text": "bom"}', b'{"text": "ff"}\x0c', b'{"text": "cr"}\r',
    b'  {"text": "spaces"}  ', b'{"text": "nan", "n": NaN}', b'{"text": "inf", "n": 1e400}',
    b'{"text": "big", "n": 123456789012345678901234567890}', b'{"text": "ctl\x01"}', b'{"text": "\\u0000"}',
    b'{"text": "two"}{}', b'{"text": "\xed\xa0\x80"}', b'{"text": "\xc0\xaf"}', b'{"text": "\xff"}', b'{"text": 5}',
    b'{"text": null}', b'{"body": "x"}', b'["text"]', b'"text"', b"", b"   ", b"\t", b"garbage", b'{"text": "\\x41"}',
    b'{"text": "tab\there"}', b'{"text": "\xe6\x97\xa5\xe6\x9c\xac"}', b'{"text": "' + b"\\n" * 50 + b'"}',
    b'{"meta": {"deep": [1, 2, {"text": "no"}]}, "text": "nested"}', b'{"text": "\\uDFFF\\uD800"}',
]


@pytest.mark.parametrize("stop", [True, False])
def test_orjson_fast_path_gives_what_json_gives(monkeypatch, stop):
    pytest.importorskip("orjson")
    data = b"\n".join(HOSTILE) + b"\n"
    block = Block("h.jsonl", True, 1, 0, data)
    fast = parse_block(block, "text", stop)
    monkeypatch.setattr(inputs, "_fast_loads", None)  # the json module only
    slow = parse_block(block, "text", stop)
    assert fast == slow
    texts, bad, nbad = fast
    assert "dup" in texts and "😀" in texts and nbad >= 10 if not stop else nbad == 1
    assert [b.message() for b in bad][:2] == [b.message() for b in slow[1]][:2]


def test_a_bad_line_far_into_a_file_read_by_two_workers_names_its_line(tmp_path):
    lines = [json.dumps({"text": f"document {i} " * 40}) for i in range(6000)]  # ~2.6 MB: several 1 MiB blocks
    lines[4321] = '{"text": "cut'
    lines[5000] = '{"body": "x"}'
    src = tmp_path / "b.jsonl"
    src.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"b\.jsonl:4322: not valid JSON") as err:
        prepare_dataset(src, tmp_path / "out", "byte", workers=2)
    assert "\n" not in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.jsonl"], "nothing half-written, no part files"
    res = prepare_dataset(src, tmp_path / "ok", "byte", workers=2, skip_bad_lines=True)
    assert res.skipped_lines == 2 and res.manifest["documents"] == 5998
    assert [m.split(": ")[0] for m in res.manifest["first_skipped"]] == [f"{src}:4322", f"{src}:5001"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.jsonl", "ok.bin", "ok.idx", "ok.manifest.json"]


def test_two_workers_write_what_one_writes_on_blocks_read_by_reference(tmp_path):
    texts = [("" if i % 50 == 0 else f"text {i} " * (i % 13)) for i in range(20000)]
    src = tmp_path / "c.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts) + "\n\n")
    one = prepare_dataset(src, tmp_path / "one", "byte", workers=1)
    two = prepare_dataset(src, tmp_path / "two", "byte", workers=2)
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"one{ext}").read_bytes() == (tmp_path / f"two{ext}").read_bytes()
    assert one.manifest["bin"] == two.manifest["bin"] and two.manifest["documents"] == 20000
    ds = IndexedDataset(tmp_path / "two")
    assert bytes(ds.document(19999)[:-1].astype(np.uint8)).decode() == texts[19999]
    assert len(ds.document(19950)) == 0  # an empty document: no sequence, no eod


def test_add_items_from_a_file_writes_what_add_items_writes(tmp_path):
    from clustertrain.data.indexed import IndexedWriter

    rng = np.random.default_rng(0)
    parts = [rng.integers(0, 50000, n).astype(np.uint16) for n in (5, 70000, 1, 3000)]
    with IndexedWriter(tmp_path / "a", np.uint16) as a, IndexedWriter(tmp_path / "b", np.uint16) as b:
        for i, tokens in enumerate(parts):
            lengths = np.array([len(tokens)], np.int32)
            a.add_items(tokens, lengths)
            (tmp_path / f"p{i}").write_bytes(tokens.tobytes() + b"trailing bytes are not copied")
            with open(tmp_path / f"p{i}", "rb") as f:
                b.add_items_from(f.fileno(), tokens.nbytes, lengths)
            a.end_document()
            b.end_document()
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"a{ext}").read_bytes() == (tmp_path / f"b{ext}").read_bytes()
    assert IndexedDataset(tmp_path / "b").n_tokens == sum(len(p) for p in parts)
    w = IndexedWriter(tmp_path / "c", np.uint16)
    with open(tmp_path / "p0", "rb") as f, pytest.raises(DataError, match="the part file was truncated"):
        w.add_items_from(f.fileno(), 10_000, np.array([5000], np.int32))
    w.abort()
