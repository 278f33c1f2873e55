"""Bench: clustertrain's preprocessing vs a Megatron-style driver, same corpus, tokenizer and workers.

The reference does what Megatron-LM's ``tools/preprocess_data.py`` does: a multiprocessing Pool
``imap`` (chunksize 32) over the JSONL lines, each worker ``json.loads`` + ``encode`` (+ eod), the
main process ``builder.add_document(ids, lengths)`` (a list, as preprocess_data.py passes it) into
megatron-core's ``IndexedDatasetBuilder``. Both outputs are checked byte-identical before any figure is printed.

Corpus: the bundled Shakespeare JSONL repeated and shuffled to ``--mb`` MB (byte tokenizer) and
``--hf-mb`` MB (a byte-level BPE trained on the corpus; BPE encoding is ~1 MB/s per core, so its
corpus is smaller). Target: ours >= 2x the reference's MB/s.

    python bench/preprocess.py [--mb 50] [--hf-mb 20] [--workers 2]
"""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing as mp
import random
import sys
import tempfile
import time
import warnings
from importlib import resources
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clustertrain.data.indexed import token_dtype  # noqa: E402
from clustertrain.data.preprocess import prepare_dataset  # noqa: E402
from clustertrain.data.tokenizers import load_tokenizer, train_tokenizer  # noqa: E402

TARGET = 2.0


def make_corpus(path: Path, mb: float, seed: int = 0) -> Path:
    src = Path(str(resources.files("clustertrain.data") / "corpus" / "shakespeare.jsonl.gz"))
    lines = gzip.open(src, "rt", encoding="utf-8").read().splitlines()
    rng = random.Random(seed)
    size, out = 0, []
    while size < mb * 1e6:
        rng.shuffle(lines)
        for line in lines:
            out.append(line)
            size += len(line) + 1
            if size >= mb * 1e6:
                break
    path.write_text("\n".join(out) + "\n", encoding="utf-8")
    return path


class _MegatronEncoder:
    """Megatron tools/preprocess_data.py's Encoder: one JSON line -> token ids (+ eod)."""

    def __init__(self, spec: str):
        self.spec = spec

    def initializer(self) -> None:
        _MegatronEncoder.tokenizer = load_tokenizer(self.spec)

    def encode(self, line: str):
        text = json.loads(line)["text"]
        ids = _MegatronEncoder.tokenizer.encode(text)
        if len(ids) > 0:
            ids.append(_MegatronEncoder.tokenizer.eod)
        return ids, [len(ids)] if ids else [], len(line)


def megatron_driver(corpus: Path, prefix: str, spec: str, workers: int) -> None:
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    encoder = _MegatronEncoder(spec)
    vocab = load_tokenizer(spec).vocab_size
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=token_dtype(vocab))
    with open(corpus, encoding="utf-8") as fin:
        pool = mp.get_context("fork").Pool(workers, initializer=encoder.initializer)
        for ids, lengths, _ in pool.imap(encoder.encode, fin, 32):
            builder.add_document(ids, lengths)
        pool.close()
        pool.join()
    builder.finalize(prefix + ".idx")


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def compare(name: str, corpus: Path, spec: str, workers: int, work: Path) -> float:
    mb = corpus.stat().st_size / 1e6
    t_ref = timed(lambda: megatron_driver(corpus, str(work / f"ref-{name}"), spec, workers))
    t_ours = timed(lambda: prepare_dataset(corpus, work / f"ours-{name}", spec, workers=workers))
    for ext in (".bin", ".idx"):
        if (work / f"ours-{name}{ext}").read_bytes() != (work / f"ref-{name}{ext}").read_bytes():
            raise SystemExit(f"{name}: outputs differ ({ext}); the comparison is void")
    ratio = t_ref / t_ours
    print(f"{name:>6}: {mb:6.1f} MB, {workers} workers | megatron-style {mb / t_ref:7.2f} MB/s | "
          f"clustertrain {mb / t_ours:7.2f} MB/s | ratio {ratio:5.2f}x (target >= {TARGET}x) "
          f"{'OK' if ratio >= TARGET else 'BELOW TARGET'}  [outputs byte-identical]")
    return ratio


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=50)
    ap.add_argument("--hf-mb", type=float, default=20)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=8192)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        byte_corpus = make_corpus(work / "corpus.jsonl", args.mb)
        hf_corpus = make_corpus(work / "corpus-hf.jsonl", args.hf_mb, seed=1)
        tok = train_tokenizer([Path(str(resources.files("clustertrain.data") / "corpus" / "shakespeare.jsonl.gz"))],
                              args.vocab, work / "tok" / "tokenizer.json")
        ratios = [compare("byte", byte_corpus, "byte", args.workers, work),
                  compare("hf-bpe", hf_corpus, f"hf:{work / 'tok' / 'tokenizer.json'}", args.workers, work)]
        print(f"vocab {tok.vocab_size} BPE; minimum ratio {min(ratios):.2f}x")


if __name__ == "__main__":
    main()
