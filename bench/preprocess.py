"""Tokenization at scale: `clustertrain data prepare` vs Megatron-LM's fast tool, and vs the 2-core limit of JSON
parsing + warm encoding, whole commands on one 1 GB JSONL corpus, side by side in one run (issue 40, item 6).

    flock /tmp/ct-heavy.lock .venv/bin/python bench/preprocess.py --megatron ~/Megatron-LM [--mb 1000] [--rounds 3]
    .venv/bin/python bench/preprocess.py --smoke            # a few MB, one round, nothing judged

Sides, interleaved in every round (A B C D, D C B A, ...), each a fresh process timed from start to exit (wall time,
start-up included) except the probe:

* ``ours``: ``clustertrain data prepare --workers N`` (N = ``--workers``, default all cores) on the whole corpus;
* ``ours, start-up``: the same on the corpus's first ~2 MB, so that ``marginal = (size - 2 MB) / (t_ours - t_small)``
  is our throughput past start-up;
* ``megatron fast`` (the named reference): Megatron-LM's ``tools/preprocess_data_fast.py --use-gigatoken
  --append-eod`` with its ``HuggingFaceTokenizer`` on the tokenizer's directory (gigatoken's own Rust JSONL reader,
  all cores: ``megatron/core/tokenizers/text/libraries/huggingface_tokenizer.py`` ``encode_files``, ``parallel=True``);
* ``limit`` (the probe): N processes, each holding 1/N of the corpus's 1 MiB blocks in memory with a warm gigatoken
  pre-token cache (one untimed pass first), run the product's own parsing (:func:`clustertrain.data.inputs.parse_block`,
  orjson when installed) and encoding (the encoder ``prepare`` chose) on their blocks at once: no reading, no eods,
  no writing, no hand-off. Its wall time is the most N cores can do for this corpus in this architecture.

Targets (RESULT lines; ``holds`` only when every round meets it):

* ours ÷ Megatron fast speed (its wall time ÷ ours), on the whole corpus: >= 3;
* our marginal throughput ÷ the limit's throughput: >= 0.7;
* the MB/s of every side and our start-up are printed as ``measured`` figures.

Byte identity (CHECK lines; the bench exits 1 when one fails): on the corpus's first ``--classic-mb`` MB (default
20; Megatron's classic tool takes ~5 min per GB on 2 cores), ``prepare``, ``prepare --encoder reference`` (Hugging
Face ``tokenizers``) and Megatron-LM's classic ``tools/preprocess_data.py --workers N --append-eod`` must write
byte-identical ``.bin``/``.idx`` (sha256); on the whole corpus, our last round's output must hold exactly the tokens
of Megatron's fast tool's, document by document, except that the fast tool writes an eod-only sequence for an
empty document where the classic tool (and so ours) writes none.

Megatron-LM: the tools are not in ``megatron-core`` nor in the repository's test tarball (core_v0.16.1 predates the
fast tool): give a checkout of https://github.com/NVIDIA/Megatron-LM that has ``tools/preprocess_data_fast.py``
(``--megatron PATH`` or ``$MEGATRON_LM``; its ``megatron`` package is put first on ``PYTHONPATH``). Its HEAD imports
``typing.override`` (Python >= 3.12); on 3.11 the bench adds a ``sitecustomize`` that aliases
``typing_extensions.override``, nothing else. Without a checkout the Megatron sides and checks are skipped (said so
on one line) and only the limit ratio is judged.

Corpus (``--corpus`` for your own JSONL): documents drawn, seeded, from the bundled Shakespeare scenes and the
Python sources of this interpreter's standard library and site-packages (~360 MB of distinct text, so a 1 GB corpus
repeats each document about three times), with the verification hard cases and empty documents mixed in, written to
``--mb`` MB. Tokenizer: a byte-level BPE of ``--vocab`` entries trained by ``clustertrain data train-tokenizer`` on
20 MB drawn the other way round (or ``--tokenizer``). The corpus and outputs live in a temporary directory (under
``--tmp``, default the system's), removed at the end; a 1 GB run needs ~3 GB free there.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import multiprocessing as mp
import os
import random
import subprocess
import sys
import sysconfig
import tempfile
import time
from importlib import resources
from pathlib import Path

from harness import Bench, Ratio, interleave

ROOT = Path(__file__).resolve().parents[1]

from clustertrain.data.fastbpe import HARD_CASES  # noqa: E402

SHIM = ("import typing\nif not hasattr(typing, 'override'):\n"
        "    import typing_extensions\n    typing.override = typing_extensions.override\n")
SMALL_MB = 2.0


def _documents(seed: int, limit: int | None = None) -> list[str]:
    """Shakespeare's scenes and up to ``limit`` Python source files of this interpreter, shuffled."""
    src = Path(str(resources.files("clustertrain.data") / "corpus" / "shakespeare.jsonl.gz"))
    docs = [json.loads(line)["text"] for line in gzip.open(src, "rt", encoding="utf-8")]
    roots = sorted({Path(sysconfig.get_paths()[k]).resolve() for k in ("stdlib", "purelib")})
    files = sorted({p.resolve() for r in roots for p in r.rglob("*.py")})
    for f in files[:limit]:
        try:
            if f.stat().st_size <= 200_000:
                docs.append(f.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            continue
    random.Random(seed).shuffle(docs)
    return docs


def make_corpus(path: Path, mb: float, docs: list[str] | None = None, seed: int = 0) -> Path:
    """``mb`` MB of JSONL from ``docs`` (cycled; default :func:`_documents`), with the hard cases and one empty
    document per ~500 mixed in. (bench/loader.py and bench/data_read.py call it with two arguments.)"""
    docs = _documents(seed) if docs is None else docs
    rng = random.Random(seed)
    target, size, i = mb * 1e6, 0, 0
    with open(path, "w", encoding="utf-8") as f:
        while size < target:
            doc = docs[i % len(docs)] if rng.random() > 0.002 else ""
            if i % 997 == 0:
                doc = HARD_CASES[(i // 997) % len(HARD_CASES)]
            line = json.dumps({"text": doc}, ensure_ascii=False) + "\n"
            f.write(line)
            size += len(line.encode("utf-8"))
            i += 1
    return path


def head(src: Path, dst: Path, mb: float) -> Path:
    """The whole lines of ``src`` within its first ``mb`` MB (at least one line)."""
    with open(src, "rb") as f:
        data = f.read(int(mb * 1e6))
        if not data.endswith(b"\n"):
            cut = data.rfind(b"\n") + 1
            data = data[:cut] if cut else data + f.readline()
    dst.write_bytes(data)
    return dst


def sha(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()[:16]


def run(argv: list[str], env: dict | None = None) -> float:
    """Wall time of one whole command; a failure stops the bench with its stderr."""
    t = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} ... failed (rc {proc.returncode}):\n{proc.stderr[-2000:]}")
    return dt


def clear(prefix: Path) -> Path:
    """Remove every file of a dataset prefix (so that `prepare` re-runs instead of finding it up to date)."""
    for p in prefix.parent.glob(prefix.name + "*"):
        p.unlink()
    return prefix


# ---- the limit probe: parse + warm encode only, N processes ----------------------------------------------------
def _probe_worker(conn, corpus: str, rank: int, n: int, tokenizer: str) -> None:
    from clustertrain.data.fastbpe import choose_encoder
    from clustertrain.data.inputs import blocks, parse_block
    from clustertrain.data.preprocess import FAST_BLOCK
    from clustertrain.data.tokenizers import encode_flat, load_tokenizer

    encoder = choose_encoder(load_tokenizer(tokenizer), ()).encoder
    mine = [b.loaded() for i, b in enumerate(blocks(Path(corpus), lambda _: None, FAST_BLOCK, by_reference=True))
            if i % n == rank]

    def one_pass() -> None:
        for b in mine:
            encode_flat(encoder, parse_block(b, "text", True)[0])

    one_pass()  # warms the pre-token cache
    conn.send(sum(len(b.data) for b in mine))
    while conn.recv() == "go":
        one_pass()
        conn.send("done")


class LimitProbe:
    """N warm processes; calling it times one parse + encode pass of the whole corpus, all at once (seconds)."""

    def __init__(self, corpus: Path, tokenizer: Path, n: int):
        ctx = mp.get_context("fork")
        self.conns, self.procs = [], []
        for rank in range(n):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_probe_worker, args=(child, str(corpus), rank, n, str(tokenizer)), daemon=True)
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)
        self.bytes = sum(c.recv() for c in self.conns)

    def __call__(self) -> float:
        t = time.perf_counter()
        for c in self.conns:
            c.send("go")
        for c in self.conns:
            c.recv()
        return time.perf_counter() - t

    def close(self) -> None:
        for c in self.conns:
            c.send("stop")
        for p in self.procs:
            p.join(10)


# ---- byte identity ------------------------------------------------------------------------------------------
def same_tokens_as_fast_tool(ours: Path, fast: Path, eod: int) -> tuple[bool, str]:
    """Our dataset vs Megatron's fast tool's, document by document, its eod-only sequences of empty documents
    aside (see the module docstring)."""
    import numpy as np

    from clustertrain.data.indexed import IndexedDataset

    a, b = IndexedDataset(ours), IndexedDataset(fast)
    if a.n_documents != b.n_documents:
        return False, f"{a.n_documents} vs {b.n_documents} documents"
    empty = np.diff(a.document_indices) == 0  # our documents with no sequence
    starts = b.sequence_pointers // b.dtype.itemsize
    eod_only = (b.sequence_lengths == 1) & (np.asarray(b.tokens[starts]) == eod)
    if not np.array_equal(np.diff(b.document_indices), np.ones(b.n_documents, np.int64)):
        return False, "the fast tool's documents are not one sequence each"
    drop = eod_only & empty
    if (empty & ~eod_only).any():
        return False, f"{int((empty & ~eod_only).sum())} empty documents of ours hold tokens in the fast tool's"
    if not np.array_equal(b.sequence_lengths[~drop], a.sequence_lengths):
        return False, "sequence lengths differ"
    keep = np.ones(len(b.tokens), bool)
    keep[starts[drop]] = False
    if not np.array_equal(np.asarray(b.tokens)[keep], np.asarray(a.tokens)):
        return False, "tokens differ"
    return True, f"{a.n_documents:,} documents, {a.n_tokens:,} tokens; {int(drop.sum())} eod-only sequences aside"


def main() -> None:
    bench = Bench("preprocess", __doc__, rounds=3)
    p = bench.parser
    p.add_argument("--mb", type=float, default=1000, help="corpus size in MB (default %(default)g: the judged size)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--classic-mb", type=float, default=20,
                   help="size of the slice checked byte-identical with Megatron's classic tool (0: the whole corpus)")
    p.add_argument("--corpus", type=Path, help="your own JSONL corpus (documents under 'text') instead of --mb")
    p.add_argument("--tokenizer", type=Path, help="a tokenizer.json (its directory needs tokenizer_config.json "
                   "for Megatron: `clustertrain data write-tokenizer-config`)")
    p.add_argument("--megatron", type=Path, default=os.environ.get("MEGATRON_LM") or None,
                   help="a Megatron-LM checkout with tools/preprocess_data_fast.py (default: $MEGATRON_LM)")
    p.add_argument("--tmp", type=Path, default=None, help="where the corpus and outputs go (default: the system's)")
    args = bench.parse()
    mb, classic_mb, train_mb = (3.0, 0.0, 2.0) if bench.smoke else (args.mb, args.classic_mb, 20.0)
    py, meg = sys.executable, args.megatron
    if meg is not None and not (meg / "tools" / "preprocess_data_fast.py").is_file():
        raise SystemExit(f"--megatron {meg}: no tools/preprocess_data_fast.py there; give a Megatron-LM checkout "
                         "that has it (github.com/NVIDIA/Megatron-LM, 2026 or later)")
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-preprocess-", dir=args.tmp) as d:
        work = Path(d)
        docs = _documents(seed=0, limit=300 if bench.smoke else None)
        corpus = args.corpus or make_corpus(work / "corpus.jsonl", mb, docs)
        size = corpus.stat().st_size / 1e6
        small = head(corpus, work / "small.jsonl", SMALL_MB)
        tok = args.tokenizer
        if tok is None:
            train = make_corpus(work / "train.jsonl", train_mb, docs[::-1], seed=1)
            tok = work / "tok" / "tokenizer.json"
            t = run([py, "-m", "clustertrain", "data", "train-tokenizer", "--input", str(train), "--vocab-size",
                     str(args.vocab), "--output", str(tok)])
            print(f"tokenizer: {args.vocab} byte-level BPE trained on {train_mb:g} MB in {t:.1f} s", flush=True)
        env = dict(os.environ, TOKENIZERS_PARALLELISM="true")
        if meg is not None:
            (work / "shim").mkdir()
            (work / "shim" / "sitecustomize.py").write_text(SHIM)
            env["PYTHONPATH"] = os.pathsep.join([str(work / "shim"), str(meg)])
        else:
            print("bench preprocess: no Megatron-LM checkout (--megatron or $MEGATRON_LM): its sides and checks are "
                  "skipped", flush=True)
        prepare = [py, "-m", "clustertrain", "data", "prepare", "--tokenizer", str(tok), "--workers",
                   str(args.workers)]
        (work / "out").mkdir()
        ours_out, small_out = work / "out" / "ours", work / "out" / "small"
        fast_out = work / "out" / "mf_text_document"  # the fast tool appends _<key>_document
        sides = {
            "ours": lambda: run([*prepare, "--input", str(corpus), "--output-prefix", str(clear(ours_out))]),
            "small": lambda: run([*prepare, "--input", str(small), "--output-prefix", str(clear(small_out))]),
        }
        if meg is not None:
            sides["fast"] = lambda: run([py, str(meg / "tools" / "preprocess_data_fast.py"), "--input", str(corpus),
                                         "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                                         str(tok.parent), "--append-eod", "--use-gigatoken",
                                         "--output-prefix", str(clear(work / "out" / "mf"))], env)
        print(f"corpus {size:,.0f} MB ({corpus}), start-up corpus {small.stat().st_size / 1e6:.1f} MB, "
              f"--workers {args.workers}; warming the limit probe ...", flush=True)
        probe = LimitProbe(corpus, tok, args.workers)
        sides["limit"] = probe
        try:
            times = interleave(sides, rounds=bench.rounds)
        finally:
            probe.close()
        small_mb = small.stat().st_size / 1e6
        n = len(times["ours"])
        marginal = [(size - small_mb) / max(t - s, 1e-9) for t, s in zip(times["ours"], times["small"])]
        limit = [probe.bytes / 1e6 / t for t in times["limit"]]
        ones = [1.0] * n
        if meg is not None:
            bench.report(Ratio.of(f"ours / Megatron fast tool speed, {size:,.0f} MB whole commands", times["fast"],
                                  times["ours"], at_least=3, unit="x"))
        bench.report(Ratio.of(f"our marginal / the {args.workers}-core limit (JSON + warm encoding)", marginal, limit,
                              at_least=0.7, unit="x"))
        bench.report(Ratio.of("ours, whole command", [size / t for t in times["ours"]], ones, unit=" MB/s"))
        bench.report(Ratio.of("ours, marginal (past start-up)", marginal, ones, unit=" MB/s"))
        bench.report(Ratio.of("ours, start-up (2 MB corpus)", times["small"], ones, unit=" s"))
        bench.report(Ratio.of(f"limit: JSON + warm encoding, {args.workers} processes", limit, ones, unit=" MB/s"))
        if meg is not None:
            bench.report(Ratio.of("Megatron fast tool, whole command", [size / t for t in times["fast"]], ones,
                                  unit=" MB/s"))

        # byte identity, after the timed rounds
        from clustertrain.data.tokenizers import load_tokenizer

        eod = load_tokenizer(str(tok)).eod
        if meg is not None:
            ok, why = same_tokens_as_fast_tool(ours_out, fast_out, eod)
            print(f"CHECK ours = Megatron fast tool's tokens, {size:,.0f} MB: {'pass' if ok else 'FAIL'} ({why})")
            if not ok:
                failed.append("fast tool")
        sl = corpus if not classic_mb or classic_mb >= size else head(corpus, work / "slice.jsonl", classic_mb)
        outs = {"prepare": work / "out" / "c-ours", "prepare --encoder reference": work / "out" / "c-ref"}
        run([*prepare, "--input", str(sl), "--output-prefix", str(clear(outs["prepare"]))])
        run([*prepare, "--input", str(sl), "--output-prefix", str(clear(outs["prepare --encoder reference"])),
             "--encoder", "reference"])
        if meg is not None:
            outs["Megatron classic tool"] = work / "out" / "mc_text_document"
            run([py, str(meg / "tools" / "preprocess_data.py"), "--input", str(sl), "--tokenizer-type",
                 "HuggingFaceTokenizer", "--tokenizer-model", str(tok.parent), "--append-eod", "--workers",
                 str(args.workers), "--output-prefix", str(work / "out" / "mc")], env)
        sums = {name: (sha(Path(f"{p}.bin")), sha(Path(f"{p}.idx"))) for name, p in outs.items()}
        ok = len(set(sums.values())) == 1
        print(f"CHECK byte-identical on {sl.stat().st_size / 1e6:,.0f} MB, {', '.join(outs)}: "
              f"{'pass' if ok else 'FAIL'} ({'; '.join(f'{k}: .bin {b} .idx {i}' for k, (b, i) in sums.items())})")
        if not ok:
            failed.append("byte identity")
    status = bench.finish()
    if failed:
        print(f"bench preprocess: FAILED checks: {', '.join(failed)}")
    sys.exit(1 if failed else status)


if __name__ == "__main__":
    main()
