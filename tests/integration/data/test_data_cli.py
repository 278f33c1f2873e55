"""`clustertrain data` as a user runs it: real subprocesses, a few-MB corpus, 2 workers."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "160"}
    return subprocess.run([sys.executable, "-m", "clustertrain", "data", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    src = Path(str(resources.files("clustertrain.data") / "corpus" / "shakespeare.jsonl.gz"))
    lines = gzip.open(src, "rt", encoding="utf-8").read().splitlines()
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    path.write_text("\n".join(lines * 3) + "\n")  # ~3.8 MB
    return path


@pytest.mark.slow
def test_prepare_two_workers_progress_rerun_validate(corpus, tmp_path):
    out = tmp_path / "ds"
    r = _cli("prepare", "--input", str(corpus), "--output-prefix", str(out), "--workers", "2")
    assert r.returncode == 0, r.stderr
    assert "tokenizing" in r.stderr and "100%" in r.stderr and "552 documents" in r.stderr and "B/s" in r.stderr
    assert "written — 552 documents" in r.stdout
    r = _cli("prepare", "--input", str(corpus), "--output-prefix", str(out), "--workers", "2")
    assert r.returncode == 0 and "up to date, nothing done" in r.stdout
    r = _cli("validate", str(out), "--full")
    assert r.returncode == 0 and "ok — 552 documents" in r.stdout, r.stdout + r.stderr
    raw = bytearray(out.with_suffix(".idx").read_bytes())
    raw[0] = ord("X")
    out.with_suffix(".idx").write_bytes(bytes(raw))
    r = _cli("validate", str(out))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"error: {out}: idx.magic: bytes 0-8 are b'XMIDIDX\\x00\\x00', expected b'MMIDIDX\\x00\\x00' (not a Megatron .idx)"]


@pytest.mark.slow
def test_train_tokenizer_then_prepare_with_it(corpus, tmp_path):
    tok = tmp_path / "tok" / "tokenizer.json"
    r = _cli("train-tokenizer", "--input", str(corpus), "--vocab-size", "2000", "--output", str(tok))
    assert r.returncode == 0 and "2,000 tokens" in r.stdout, r.stderr
    r = _cli("prepare", "-i", str(corpus), "-o", str(tmp_path / "hf"), "--tokenizer", f"hf:{tok}", "--workers", "2", "--no-append-eod")
    assert r.returncode == 0, r.stderr
    assert "uint16, tokenizer hf-" in r.stdout
    assert "encoder: gigatoken " in r.stderr and "matches tokenizers on all" in r.stderr, r.stderr
    r = _cli("prepare", "-i", str(corpus), "-o", str(tmp_path / "ref"), "--tokenizer", str(tok), "--no-append-eod",
             "--encoder", "reference")
    assert r.returncode == 0 and "encoder: tokenizers " in r.stderr and "(--encoder reference)" in r.stderr, r.stderr
    assert (tmp_path / "ref.bin").read_bytes() == (tmp_path / "hf.bin").read_bytes()
    r = _cli("prepare", "-i", str(corpus), "-o", str(tmp_path / "x"), "--tokenizer", str(tok), "--encoder", "fastest")
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "error: --encoder fastest: unknown; valid: auto, reference"], r.stderr
    assert not list(tmp_path.glob("x.*"))


@pytest.mark.slow
def test_user_mistakes_exit_2_with_one_line(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\n{"text": \n')
    r = _cli("prepare", "-i", str(tmp_path / "bad.jsonl"), "-o", str(tmp_path / "o"))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith(f"error: {tmp_path / 'bad.jsonl'}:2: not valid JSON")
    r = _cli("prepare", "-i", str(tmp_path / "bad.jsonl"), "-o", str(tmp_path / "o"), "--skip-bad-lines")
    assert r.returncode == 0 and "skipped 1 bad lines" in r.stdout
    r = _cli("prepare", "-i", str(tmp_path / "bad.jsonl"), "-o", str(tmp_path / "o2"), "--tokenizer", "gpt2")
    assert r.returncode == 2 and "unknown tokenizer 'gpt2'" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_train_tokenizer_says_when_it_stops_short_of_the_size_asked(corpus, tmp_path):
    tok = tmp_path / "tok" / "tokenizer.json"
    r = _cli("train-tokenizer", "--input", str(corpus), "--vocab-size", "32000", "--output", str(tok))
    assert r.returncode == 0, r.stderr
    assert "23,990 tokens" in r.stdout
    assert "note: asked for 32,000, reached 23,990" in r.stdout and "between 23,990 and 24,064" in r.stdout
