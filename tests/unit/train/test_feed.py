"""The data path (:class:`clustertrain.train.feed.BatchFeed`): which samples each rank reads at a step, and the
read-ahead — the same batches in the same order with and without it, the next micro-batch (across the step
boundary too) read before the current one is computed on."""

from __future__ import annotations

import numpy as np
import torch

from clustertrain.train.feed import BatchFeed

SEQ = 8


class Samples:
    """An in-memory token array read as GPTSamples is: row ``i`` is sample ``i`` (seq_len + 1 tokens)."""

    def __init__(self, n: int = 256):
        self.tokens = np.arange(n * (SEQ + 1), dtype=np.int64).reshape(n, SEQ + 1)

    def batch(self, start: int, count: int) -> np.ndarray:
        return self.tokens[start:start + count]


def feed(dp_rank: int = 0, prefetch: bool = False, device: str = "cpu") -> BatchFeed:
    return BatchFeed(Samples(), global_batch=12, micro_batch=2, dp_rank=dp_rank, accum=3,
                     device=torch.device(device), prefetch=prefetch)


def first_samples(f: BatchFeed, step: int) -> list[int]:
    return [int(x[0, 0]) // (SEQ + 1) for x, _ in f.step_batches(step)]


def test_ranks_read_disjoint_slices_of_each_global_batch():
    seen = sorted(s for rank in (0, 1) for s in first_samples(feed(rank), 3))
    # step 3 covers samples 36..47: two dp ranks x three micro-batches of two, no sample twice
    assert seen == [36, 38, 40, 42, 44, 46]
    x, y = feed().step_batches(0)[0]
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one token


def test_read_ahead_yields_the_same_batches_and_reads_one_ahead():
    plain, ahead = feed(), feed(prefetch=True)
    for step in range(3):
        for (x0, y0), (x1, y1) in zip(plain.step_batches(step), ahead.step_batches(step)):
            assert torch.equal(x0, x1) and torch.equal(y0, y1)
    assert plain.reads == [(s, m) for s in range(3) for m in range(3)]
    # each get() starts the next read before it returns, the first of the next step after the last of this one
    assert ahead.reads == [(0, 0)] + [(s, m) for s in range(3) for m in range(3)][1:] + [(3, 0)]
    f = feed(prefetch=True)
    f.get(5, 2)
    assert f.reads == [(5, 2), (6, 0)]


def test_a_pipeline_takes_the_step_at_once():
    f = feed()
    parts: list[str] = []

    class Part:
        def __init__(self, name):
            parts.append(name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    batches = f.step_batches(1, Part, lazy=False)
    assert len(batches) == 3 and f.reads == [(1, 0), (1, 1), (1, 2)] and parts == ["data"]
