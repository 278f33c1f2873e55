"""Bench: GPTSamples samples/s vs megatron-core's GPTDataset on the same files, seed and split.

Both build their document/sample/shuffle indices from scratch (no cache), then read ``--samples``
consecutive global samples as a trainer does (ours: ``batch(start, 32)`` -> int64 array; Megatron:
``dataset[i]`` with ``create_attention_mask=False``, stacked the same way). Every sample is checked
equal between the two before figures are printed. Target: ours >= 1x.

    python bench/loader.py [--mb 20] [--seq-len 1024] [--samples 20000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from clustertrain.data.preprocess import prepare_dataset  # noqa: E402
from clustertrain.data.sample_index import GPTSamples  # noqa: E402

TARGET = 1.0
BATCH = 32


class _Tok:
    unique_identifiers = {"class": "byte-v1"}
    vocab_size, eod, pad = 258, 256, 257


def megatron_dataset(prefix: str, seq_len: int, seed: int, num_samples: int):
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    cfg = GPTDatasetConfig(random_seed=seed, sequence_length=seq_len, blend=([prefix], None), split="98,1,1",
                           tokenizer=_Tok(), reset_position_ids=False, reset_attention_mask=False,
                           eod_mask_loss=False, create_attention_mask=False, path_to_cache=None)
    return BlendedMegatronDatasetBuilder(GPTDataset, [num_samples, None, None], lambda: True, cfg).build()[0]


def main() -> None:
    from preprocess import make_corpus

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=20)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    import megatron.core.datasets.gpt_dataset  # noqa: F401  (import cost kept out of the timing)

    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        prepare_dataset(make_corpus(work / "c.jsonl", args.mb), work / "ds", "byte", workers=2)
        prefix, n = str(work / "ds"), args.samples

        t = time.perf_counter()
        ref = megatron_dataset(prefix, args.seq_len, args.seed, n)
        ref_build = time.perf_counter() - t
        t = time.perf_counter()
        ref_out = [np.stack([ref[i]["tokens"].numpy() for i in range(s, min(s + BATCH, n))]) for s in range(0, n, BATCH)]
        ref_read = time.perf_counter() - t

        t = time.perf_counter()
        ours = GPTSamples(prefix, args.seq_len, args.seed, "98,1,1", "train", num_samples=n, cache=False)
        our_build = time.perf_counter() - t
        t = time.perf_counter()
        our_out = [ours.batch(s, min(BATCH, n - s)) for s in range(0, n, BATCH)]
        our_read = time.perf_counter() - t

        if len(ours) != len(ref) or not all(np.array_equal(a[:, :-1], b) for a, b in zip(our_out, ref_out)):
            raise SystemExit("samples differ from Megatron's; the comparison is void")
        ref_rate, our_rate = n / (ref_build + ref_read), n / (our_build + our_read)
        ratio = our_rate / ref_rate
        print(f"{args.mb:.0f} MB byte-tokenized, seq_len {args.seq_len}, {n} samples read (the index holds {len(ours)})")
        print(f"megatron GPTDataset: build {ref_build:6.2f}s  read {n / ref_read:9.0f} samples/s  overall {ref_rate:9.0f} samples/s")
        print(f"clustertrain       : build {our_build:6.2f}s  read {n / our_read:9.0f} samples/s  overall {our_rate:9.0f} samples/s")
        print(f"ratio {ratio:.2f}x read-only {ref_read / our_read:.2f}x (target >= {TARGET}x) "
              f"{'OK' if ratio >= TARGET else 'BELOW TARGET'}  [all samples identical]")


if __name__ == "__main__":
    main()
