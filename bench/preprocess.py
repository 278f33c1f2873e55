"""Bench: `clustertrain data prepare` against Megatron-LM's preprocessing, whole commands, same corpus, tokenizer
and cores, side by side in one run.

Rows, each a fresh process timed from start to exit (wall time, start-up included), per corpus size:

* ``clustertrain fast``: ``clustertrain data prepare --workers N`` (gigatoken where it is exact; the default);
* ``clustertrain reference``: the same with ``--encoder reference`` (Hugging Face ``tokenizers``);
* ``megatron classic``: Megatron-LM's ``tools/preprocess_data.py --workers N`` with its ``HuggingFaceTokenizer``;
* ``megatron fast``: ``tools/preprocess_data_fast.py --use-gigatoken`` (gigatoken's own JSONL reader, all cores).

The Megatron rows run when a Megatron-LM checkout is given (``--megatron PATH`` or ``$MEGATRON_LM``; the repository
is public: https://github.com/NVIDIA/Megatron-LM). Its HEAD imports ``typing.override`` (Python >= 3.12); on 3.11
the bench puts a ``sitecustomize`` on its ``PYTHONPATH`` that aliases ``typing_extensions.override``, nothing else.

Checks before any figure: the ``.bin``/``.idx`` of both clustertrain rows and Megatron's classic tool are
byte-identical (sha256), or the run stops. Megatron's fast tool is reported as identical or not: it writes an
eod-only sequence for each empty document, where the classic tool writes none.

Corpus (``--corpus`` to use your own JSONL): documents drawn, seeded, from the bundled Shakespeare scenes and the
Python sources of this interpreter's standard library and site-packages (code, prose and tables, a vocabulary
far wider than Shakespeare's), with the verification hard cases and empty documents mixed in, written as JSONL
to each ``--mb`` size. Tokenizer: a byte-level BPE of ``--vocab`` entries trained by ``clustertrain data
train-tokenizer`` on the first 20 MB (or ``--tokenizer``). Target: clustertrain fast <= 1/2 of megatron fast.

    python bench/preprocess.py [--mb 20 100 500] [--workers 2] [--megatron ~/Megatron-LM]
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import random
import subprocess
import sys
import sysconfig
import tempfile
import time
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from clustertrain.data.fastbpe import HARD_CASES  # noqa: E402

TARGET = 0.5
SHIM = ("import typing\nif not hasattr(typing, 'override'):\n"
        "    import typing_extensions\n    typing.override = typing_extensions.override\n")


def _documents(seed: int) -> list[str]:
    src = Path(str(resources.files("clustertrain.data") / "corpus" / "shakespeare.jsonl.gz"))
    docs = [json.loads(line)["text"] for line in gzip.open(src, "rt", encoding="utf-8")]
    roots = {Path(sysconfig.get_paths()[k]).resolve() for k in ("stdlib", "purelib")}
    files = sorted({p.resolve() for r in roots for p in r.rglob("*.py")})
    for f in files:
        try:
            if f.stat().st_size <= 200_000:
                docs.append(f.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            continue
    random.Random(seed).shuffle(docs)
    return docs


def make_corpus(path: Path, mb: float, docs: list[str], seed: int = 0) -> Path:
    """``mb`` MB of JSONL from ``docs`` (cycled), with the hard cases and one empty document per ~500 mixed in."""
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


def sha(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()[:16]


def run(argv: list[str], env: dict | None = None) -> float:
    t = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} ... failed (rc {proc.returncode}):\n{proc.stderr[-2000:]}")
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, nargs="+", default=[20, 100, 500])
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--corpus", type=Path, help="your own JSONL corpus (documents under 'text') instead of sizes")
    ap.add_argument("--tokenizer", type=Path, help="a tokenizer.json (its directory needs tokenizer_config.json "
                    "for Megatron: `clustertrain data write-tokenizer-config`)")
    ap.add_argument("--megatron", type=Path, default=os.environ.get("MEGATRON_LM"),
                    help="a Megatron-LM checkout (default: $MEGATRON_LM); without it the Megatron rows are skipped")
    args = ap.parse_args()
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="bench-preprocess-") as d:
        work = Path(d)
        corpora: list[Path] = []
        if args.corpus:
            corpora = [args.corpus]
        else:
            docs = _documents(seed=0)
            for mb in args.mb:
                corpora.append(make_corpus(work / f"corpus-{mb:g}mb.jsonl", mb, docs))
        tok = args.tokenizer
        if tok is None:
            train = make_corpus(work / "train.jsonl", 20, docs[::-1], seed=1) if not args.corpus else args.corpus
            tok = work / "tok" / "tokenizer.json"
            t = run([py, "-m", "clustertrain", "data", "train-tokenizer", "--input", str(train), "--vocab-size",
                     str(args.vocab), "--output", str(tok)])
            print(f"tokenizer: {args.vocab} byte-level BPE trained on {train.stat().st_size / 1e6:.0f} MB in {t:.1f} s")
        env = dict(os.environ, TOKENIZERS_PARALLELISM="true")
        if args.megatron:
            (work / "shim").mkdir()
            (work / "shim" / "sitecustomize.py").write_text(SHIM)
            env["PYTHONPATH"] = os.pathsep.join([str(work / "shim"), str(args.megatron)])
        print(f"{os.cpu_count()} cores, --workers {args.workers}; wall time of whole commands, start-up included")
        for corpus in corpora:
            mb = corpus.stat().st_size / 1e6
            out = work / corpus.stem
            out.mkdir()
            prepare = [py, "-m", "clustertrain", "data", "prepare", "--input", str(corpus), "--tokenizer", str(tok),
                       "--workers", str(args.workers)]
            rows: dict[str, tuple[float, Path]] = {}
            rows["clustertrain fast"] = (run([*prepare, "--output-prefix", str(out / "fast")]), out / "fast")
            rows["clustertrain reference"] = (run([*prepare, "--output-prefix", str(out / "ref"), "--encoder",
                                                   "reference"]), out / "ref")
            if args.megatron:
                common = ["--input", str(corpus), "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                          str(tok.parent), "--append-eod"]
                rows["megatron classic"] = (run([py, str(args.megatron / "tools" / "preprocess_data.py"), *common,
                                                 "--output-prefix", str(out / "mc"), "--workers", str(args.workers)],
                                                env), out / "mc_text_document")
                rows["megatron fast"] = (run([py, str(args.megatron / "tools" / "preprocess_data_fast.py"), *common,
                                              "--output-prefix", str(out / "mf"), "--use-gigatoken"], env),
                                         out / "mf_text_document")
            sums = {name: (sha(Path(f"{p}.bin")), sha(Path(f"{p}.idx"))) for name, (_, p) in rows.items()}
            exact = [n for n in rows if n != "megatron fast"]
            if len({sums[n] for n in exact}) != 1:
                raise SystemExit(f"{corpus.name}: outputs differ ({sums}); the comparison is void")
            print(f"\n{corpus.name}: {mb:.0f} MB; {', '.join(exact)}: byte-identical (.bin {sums[exact[0]][0]}, "
                  f".idx {sums[exact[0]][1]})")
            fast = rows["clustertrain fast"][0]
            for name, (t, _) in rows.items():
                same = "" if name in exact else ("  identical" if sums[name] == sums[exact[0]] else
                                                 "  differs (eod-only sequences for empty documents)")
                print(f"  {name:<24} {t:7.2f} s {mb / t:8.1f} MB/s  {t / fast:5.2f}x clustertrain fast's time{same}")
            if "megatron fast" in rows:
                ratio = fast / rows["megatron fast"][0]
                print(f"  clustertrain fast / megatron fast = {ratio:.2f} (target <= {TARGET}) "
                      f"{'OK' if ratio <= TARGET else 'ABOVE TARGET'}")


if __name__ == "__main__":
    main()
