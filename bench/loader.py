"""Bench: GPTSamples samples/s vs megatron-core's GPTDataset (the named reference) on the same files, seed and split.

    flock /tmp/ct-heavy.lock .venv/bin/python bench/loader.py [--mb 20] [--seq-len 1024] [--samples 20000] [--rounds 5]
    .venv/bin/python bench/loader.py --smoke            # 0.3 MB, 300 samples, one round, nothing judged

Each side builds its document/sample/shuffle indices from scratch (no cache), then reads ``--samples`` consecutive
global samples as a trainer does (ours: ``GPTSamples.batch(start, 32)`` -> int64 array; Megatron: ``dataset[i]``
with ``create_attention_mask=False``, stacked the same way). The sides run interleaved (ours, megatron; megatron,
ours; ...: bench/harness.py), and in the first round every sample is checked equal between the two, or the bench
stops. Reference: megatron-core 0.16.1 ``megatron/core/datasets/gpt_dataset.py`` ``GPTDataset`` built through
``BlendedMegatronDatasetBuilder`` (``path_to_cache=None``: no cache, no torch.distributed).

Corpus: the bundled Shakespeare scenes (``clustertrain/data/corpus/shakespeare.jsonl.gz``) cycled to ``--mb`` MB by
bench/preprocess.py's ``make_corpus`` (documents passed explicitly), byte-tokenized by ``prepare_dataset``.

Targets (RESULT lines): ours ÷ GPTDataset samples/s, build + read: >= 1x. Read-only samples/s ÷ GPTDataset's read-only
samples/s is printed as a ``measured`` figure.
"""

from __future__ import annotations

import gzip
import json
import sys
import tempfile
import time
import warnings
from importlib import resources
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Bench, Ratio, interleave  # noqa: E402  (puts the repository on sys.path)

from clustertrain.data.preprocess import prepare_dataset  # noqa: E402
from clustertrain.data.sample_index import GPTSamples  # noqa: E402

TARGET = 1.0
BATCH = 32


class _Tok:
    unique_identifiers = {"class": "byte-v1"}
    vocab_size, eod, pad = 258, 256, 257


def shakespeare() -> list[str]:
    src = Path(str(resources.files("clustertrain.data") / "corpus" / "shakespeare.jsonl.gz"))
    return [json.loads(line)["text"] for line in gzip.open(src, "rt", encoding="utf-8")]


def corpus(path: Path, mb: float) -> Path:
    """``mb`` MB of JSONL: bench/preprocess.py's ``make_corpus`` (its hard cases and empty documents mixed in) over
    the Shakespeare scenes, passed explicitly so the call holds whether its ``docs`` has a default or not."""
    from preprocess import make_corpus

    return make_corpus(path, mb, shakespeare())


def megatron_dataset(prefix: str, seq_len: int, seed: int, num_samples: int):
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    cfg = GPTDatasetConfig(random_seed=seed, sequence_length=seq_len, blend=([prefix], None), split="98,1,1",
                           tokenizer=_Tok(), reset_position_ids=False, reset_attention_mask=False,
                           eod_mask_loss=False, create_attention_mask=False, path_to_cache=None)
    return BlendedMegatronDatasetBuilder(GPTDataset, [num_samples, None, None], lambda: True, cfg).build()[0]


def main() -> int:
    bench = Bench("loader", __doc__)
    bench.parser.add_argument("--mb", type=float, default=20)
    bench.parser.add_argument("--seq-len", type=int, default=1024)
    bench.parser.add_argument("--samples", type=int, default=20000)
    bench.parser.add_argument("--seed", type=int, default=1234)
    args = bench.parse()
    mb, seq_len, n = (0.3, 128, 300) if bench.smoke else (args.mb, args.seq_len, args.samples)
    warnings.filterwarnings("ignore")
    import megatron.core.datasets.gpt_dataset  # noqa: F401  (import cost kept out of the timing)

    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        prepare_dataset(corpus(work / "c.jsonl", mb), work / "ds", "byte", workers=1 if bench.smoke else 2)
        prefix = str(work / "ds")
        reads: dict[str, list[float]] = {"ours": [], "megatron": []}
        outs: dict[str, list[np.ndarray]] = {}

        def ours() -> float:
            t = time.perf_counter()
            ds = GPTSamples(prefix, seq_len, args.seed, "98,1,1", "train", num_samples=n, cache=False)
            t1 = time.perf_counter()
            out = [ds.batch(s, min(BATCH, n - s)) for s in range(0, n, BATCH)]
            t2 = time.perf_counter()
            reads["ours"].append(n / (t2 - t1))
            outs.setdefault("ours", [a[:, :-1] for a in out])
            outs.setdefault("ours_len", [np.array(len(ds))])
            return n / (t2 - t)

        def reference() -> float:
            t = time.perf_counter()
            ds = megatron_dataset(prefix, seq_len, args.seed, n)
            t1 = time.perf_counter()
            out = [np.stack([ds[i]["tokens"].numpy() for i in range(s, min(s + BATCH, n))]) for s in range(0, n, BATCH)]
            t2 = time.perf_counter()
            reads["megatron"].append(n / (t2 - t1))
            outs.setdefault("megatron", out)
            outs.setdefault("megatron_len", [np.array(len(ds))])
            return n / (t2 - t)

        rates = interleave({"ours": ours, "megatron": reference}, rounds=args.rounds)
        same = int(outs["ours_len"][0]) == int(outs["megatron_len"][0]) and all(
            np.array_equal(a, b) for a, b in zip(outs["ours"], outs["megatron"]))
        if not same:
            print("loader: samples differ from Megatron's GPTDataset; the comparison is void", file=sys.stderr)
            return 1
    print(f"{mb:g} MB byte-tokenized, seq_len {seq_len}, {n} samples read per side per round; all samples identical")
    bench.report(Ratio.of("loader GPTSamples / megatron GPTDataset samples/s (build + read)", rates["ours"],
                          rates["megatron"], at_least=TARGET))
    bench.report(Ratio.of("loader GPTSamples / megatron GPTDataset samples/s (read only)", reads["ours"],
                          reads["megatron"]))
    return bench.finish()


if __name__ == "__main__":
    sys.exit(main())
