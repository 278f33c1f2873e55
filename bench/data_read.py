"""Bench: the cost of reading training samples with positional reads (``os.pread``, today's
:meth:`IndexedDataset.read`) instead of slicing the ``.bin``'s memory map (the read path before issue 18, which a
file truncated under the job turns into a SIGBUS).

One dataset, one sample index, the same ``batch(start, micro_batch)`` calls a trainer makes, timed alternately
with each read path (several rounds, best of each), in one run; the batches are checked equal. The file is in
the page cache for both (as a dataset being trained on is). Target: pread within 1.25x of the memory map.

    python bench/data_read.py [--mb 20] [--seq-len 2048] [--batch 8] [--samples 20000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from clustertrain.data.indexed import IndexedDataset  # noqa: E402
from clustertrain.data.preprocess import prepare_dataset  # noqa: E402
from clustertrain.data.sample_index import GPTSamples  # noqa: E402

TARGET = 1.25


class MemmapRead(IndexedDataset):
    """The read path before issue 18: a slice of the memory-mapped ``.bin``."""

    def read(self, start: int, count: int) -> np.ndarray:
        return self.tokens[start : start + count]


def timed(samples: GPTSamples, starts: range, batch: int) -> tuple[float, list[np.ndarray]]:
    t = time.perf_counter()
    out = [samples.batch(s, batch) for s in starts]
    return time.perf_counter() - t, out


def main() -> None:
    from preprocess import make_corpus

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=20)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        prepare_dataset(make_corpus(work / "c.jsonl", args.mb), work / "ds", "byte", workers=2)
        samples = GPTSamples(work / "ds", args.seq_len, 1234, cache=False, vocab_size=258)
        n = min(args.samples, len(samples)) // args.batch * args.batch
        starts = range(0, n, args.batch)
        ds = samples._parts[0].ds
        best = {"pread": float("inf"), "memmap": float("inf")}
        for _ in range(args.rounds):
            for name, cls in (("pread", IndexedDataset), ("memmap", MemmapRead)):
                ds.__class__ = cls
                seconds, out = timed(samples, starts, args.batch)
                best[name] = min(best[name], seconds)
                if name == "pread":
                    ref = out
                elif not all(np.array_equal(a, b) for a, b in zip(ref, out)):
                    raise SystemExit("the two read paths gave different batches; the comparison is void")
        ratio = best["pread"] / best["memmap"]
        print(f"{args.mb:.0f} MB byte-tokenized, seq_len {args.seq_len}, {n} samples in batches of {args.batch} "
              f"(vocabulary check on), best of {args.rounds} rounds each")
        for name in ("memmap", "pread"):
            print(f"{name:6s}: {n / best[name]:9.0f} samples/s  ({best[name] / n * 1e6:6.1f} us/sample)")
        print(f"pread / memmap time {ratio:.2f}x (target <= {TARGET}x) {'OK' if ratio <= TARGET else 'ABOVE TARGET'}"
              "  [batches identical]")


if __name__ == "__main__":
    main()
