"""The data path on a GPU (:class:`clustertrain.train.feed.BatchFeed`): micro-batches read ahead on the copy stream
are the same tokens as the host reads, and the step's compute stream may use them (it waited for the copy)."""

from __future__ import annotations

import pytest
import torch

from tests.unit.train.test_feed import feed

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_prefetched_device_batches_equal_the_host_ones():
    host, dev = feed(), feed(prefetch=True, device="cuda")
    for step in range(3):
        for (x0, _), (x1, _) in zip(host.step_batches(step), dev.step_batches(step)):
            assert x1.is_cuda and torch.equal(x0, (x1 + 0).cpu())  # + 0: a kernel on the compute stream reads it
    assert dev.reads[-1] == (3, 0)  # the next step's first micro-batch is already on its way
