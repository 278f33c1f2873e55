"""Bench: the cost of reading training samples with positional reads (``os.pread``, today's
:meth:`IndexedDataset.read`) instead of slicing the ``.bin``'s memory map (the read path before issue 18, the named
reference, which a file truncated under the job turns into a SIGBUS).

    flock /tmp/ct-heavy.lock .venv/bin/python bench/data_read.py [--mb 20] [--seq-len 2048] [--batch 8] \
        [--samples 20000] [--rounds 5]
    .venv/bin/python bench/data_read.py --smoke          # 0.3 MB, one round, nothing judged

One dataset, one sample index, the same ``batch(start, micro_batch)`` calls a trainer makes (vocabulary check on),
timed with each read path in interleaved rounds (pread, memmap; memmap, pread; ...: bench/harness.py), in one run;
every round's batches are checked equal between the two, or the bench stops. The file is in the page cache for both
(as a dataset being trained on is). Corpus: the bundled Shakespeare scenes cycled to ``--mb`` MB (bench/loader.py's
``corpus``), byte-tokenized.

Target (RESULT line): pread time ÷ memory-map time <= 1.25x.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Bench, Ratio, interleave  # noqa: E402  (puts the repository on sys.path)

from clustertrain.data.indexed import IndexedDataset  # noqa: E402
from clustertrain.data.preprocess import prepare_dataset  # noqa: E402
from clustertrain.data.sample_index import GPTSamples  # noqa: E402

TARGET = 1.25


class MemmapRead(IndexedDataset):
    """The read path before issue 18: a slice of the memory-mapped ``.bin``."""

    def read(self, start: int, count: int) -> np.ndarray:
        return self.tokens[start : start + count]


def main() -> int:
    from loader import corpus

    bench = Bench("data_read", __doc__)
    bench.parser.add_argument("--mb", type=float, default=20)
    bench.parser.add_argument("--seq-len", type=int, default=2048)
    bench.parser.add_argument("--batch", type=int, default=8)
    bench.parser.add_argument("--samples", type=int, default=20000)
    args = bench.parse()
    mb, seq_len, want = (0.3, 256, 1000) if bench.smoke else (args.mb, args.seq_len, args.samples)
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        prepare_dataset(corpus(work / "c.jsonl", mb), work / "ds", "byte", workers=1 if bench.smoke else 2)
        samples = GPTSamples(work / "ds", seq_len, 1234, cache=False, vocab_size=258)
        n = min(want, len(samples)) // args.batch * args.batch
        starts = range(0, n, args.batch)
        ds = samples._parts[0].ds
        out: dict[str, list[np.ndarray]] = {}

        def side(name: str, cls: type):
            def run() -> float:
                ds.__class__ = cls
                t = time.perf_counter()
                out[name] = [samples.batch(s, args.batch) for s in starts]
                return time.perf_counter() - t
            return run

        def checked(name: str, cls: type):
            run = side(name, cls)

            def go() -> float:
                seconds = run()
                if len(out) == 2:  # both sides ran this round: their batches must be equal
                    if not all(np.array_equal(a, b) for a, b in zip(out["pread"], out["memmap"])):
                        raise SystemExit("data_read: the two read paths gave different batches; the comparison is void")
                    out.clear()
                return seconds
            return go

        times = interleave({"pread": checked("pread", IndexedDataset), "memmap": checked("memmap", MemmapRead)},
                           rounds=args.rounds)
        ds.__class__ = IndexedDataset
    print(f"{mb:g} MB byte-tokenized, seq_len {seq_len}, {n} samples in batches of {args.batch} per side per round "
          f"(vocabulary check on); batches identical; pread {n / min(times['pread']):,.0f} samples/s, memmap "
          f"{n / min(times['memmap']):,.0f} samples/s (best rounds)")
    bench.report(Ratio.of("data_read pread / memmap time", times["pread"], times["memmap"], at_most=TARGET))
    return bench.finish()


if __name__ == "__main__":
    sys.exit(main())
