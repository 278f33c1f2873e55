"""Checkpoint speed: sync save throughput vs a plain sequential write, and how long an async save stalls the step.

    .venv/bin/python bench/checkpoint.py [--mb 300] [--rounds 5] [--dir DIR] [--smoke]

One process, one disk (``--dir``, default a temp directory under the current one), every side measured in each
round, interleaved (bench/harness.py: the order alternates between rounds, a ratio per round, its median and
spread). The state is a model of Linear layers plus its AdamW moments (fp32: 3 x 4 bytes per parameter, ``--mb`` in
total), saved through :class:`clustertrain.train.checkpoint.CheckpointManager` exactly as the trainer does (DCP
files, meta.json, renames, ``latest``; every file fsynced).

References and targets (issue 40):

(a) sync save MB/s ÷ sequential write MB/s, target >= 0.7. The reference writes the same tensors' bytes, one after
    another, into one file with ``write`` calls and one ``fsync`` (the best a single writer gets from this disk).
(b) async stall ÷ sync save time, target <= 0.1. The stall is how long ``save(..., async_save=True)`` blocks the
    caller with the copy inside it (staging the state into shared CPU memory; the write then runs in the checkpoint
    writer process, :mod:`clustertrain.train.checkpoint_async`, waited for outside the timed part). The writer
    process is started first (``prepare_async``, as the trainer does at start-up); a warm-up round allocates the
    staging buffers (reused after).
(c) the same target as (b), judged on what the trainer's step actually waits for: the same save with overlapped staging — what the trainer does (``Trainer`` sets
    ``overlap_staging`` with async checkpoints): ``save`` returns before the copy, which runs in the stager's thread
    behind the next forward and backward; the trainer waits for it (``staged``) before the optimizer step. Printed:
    what ``save`` blocks ÷ sync save, and the copy's own time ÷ sync save (hidden when a forward and backward take
    at least that long).
(d) measured, no target: a bare ``copy_`` of the same tensors into preallocated buffers ÷ sync save — the floor of
    (b), set by the machine's memory bandwidth against its disk's.

Each round deletes its files after the timed parts (``keep_last`` pruning is left out of the save time: it deletes,
it does not write). No timed asserts: this prints figures and targets.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

from harness import ROOT, Bench, Ratio, interleave  # noqa: F401 (ROOT puts the repository on sys.path)


def build_state(mb: int, device: str = "cpu"):
    """A model + AdamW (one step taken, so both moments exist) holding about ``mb`` MB in fp32."""
    import torch

    width = 1024
    layers = max(1, round(mb * 1e6 / 12 / (width * width + width)))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)]).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return model, opt


def state_bytes(model, opt) -> int:
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for st in opt.state.values():
        total += sum(v.numel() * v.element_size() for v in st.values())
    return total


def sequential_write(model, opt, path: Path) -> float:
    """Seconds to write every tensor's bytes (already in CPU memory) into one file, then fsync."""
    tensors = [t.detach().cpu() for t in list(model.parameters()) + [v for st in opt.state.values() for v in st.values()]]
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        for t in tensors:
            f.write(memoryview(t.detach().numpy()).cast("B"))
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - t0


def main() -> int:
    bench = Bench("checkpoint", __doc__)
    bench.parser.add_argument("--mb", type=int, default=300, help="state size in MB (params + AdamW moments)")
    bench.parser.add_argument("--threads", type=int, default=1,
                              help="torch CPU threads (copies are memory-bound; more threads spin on a busy small machine)")
    bench.parser.add_argument("--device", default="cpu", help="where the state lives (cuda: staging is a pinned D2H copy)")
    bench.parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir under .)")
    args = bench.parse()
    mb_state = 4 if bench.smoke else args.mb
    warnings.filterwarnings("ignore")  # DCP warns that it runs without a process group
    import torch

    torch.set_num_threads(args.threads)

    from clustertrain.train.checkpoint import CheckpointManager
    from clustertrain.train.checkpoint_state import TrainState, app_state

    model, opt = build_state(mb_state, args.device)
    size = state_bytes(model, opt)
    tensors = list(model.parameters()) + [v for st in opt.state.values() for v in st.values() if v.dim() > 0]
    buffers = [torch.empty_like(t, device="cpu").share_memory_() for t in tensors]
    base = Path(tempfile.mkdtemp(prefix=".bench-ckpt-", dir=args.dir or Path.cwd()))
    mgr = CheckpointManager(base / "ckpt", keep_last=1000, fingerprint="f", project="bench", model_name="m", rank=0,
                            world_size=1, layout={"world": 1})
    step = [0]
    copies: list[float] = []

    def save(async_save: bool = False, overlap: bool = False) -> float:
        step[0] += 1
        mgr._async.overlap = overlap
        t0 = time.perf_counter()
        mgr.save(step[0], 0, app_state(model, opt, TrainState(step[0], 0)), async_save=async_save)
        stall = time.perf_counter() - t0
        if overlap:
            mgr.staged()
            copies.append(time.perf_counter() - t0)
        mgr.wait()
        for old in (base / "ckpt").glob("step_*"):  # outside the timed part (keep_last deletes are not writes)
            shutil.rmtree(old)
        return stall

    def reference() -> float:
        t = sequential_write(model, opt, base / "sequential.bin")
        (base / "sequential.bin").unlink()
        return t

    def copy() -> float:
        t0 = time.perf_counter()
        for b, t in zip(buffers, tensors):
            b.copy_(t)
        return time.perf_counter() - t0

    t0 = time.perf_counter()
    mgr.prepare_async()
    mgr._async._writer.install()  # waits until the writer process runs (spawn, import torch, its gloo world)
    writer_start = time.perf_counter() - t0
    try:
        # the warm-up round allocates the staging buffers and warms the page cache; its figures are dropped
        t = interleave({"reference": reference, "sync": save, "async": lambda: save(True),
                        "overlapped": lambda: save(True, True), "copy": copy}, rounds=bench.rounds, warmup=1)
    finally:
        mgr.close()
        shutil.rmtree(base, ignore_errors=True)
    copies = copies[1:]  # the warm-up round's

    mb = size / 1e6
    med = {k: sorted(v)[len(v) // 2] for k, v in t.items()}
    print(f"state: {mb:.0f} MB ({sum(p.numel() for p in model.parameters()):,} parameters + AdamW moments), on "
          f"{args.device}, disk of {base.parent}; writer process start-up, off the training path: {writer_start:.2f} s")
    print(f"medians: sequential write + fsync {med['reference']:.3f} s ({mb / med['reference']:.0f} MB/s); sync save "
          f"{med['sync']:.3f} s ({mb / med['sync']:.0f} MB/s); async stall {med['async']:.3f} s; overlapped stall "
          f"{med['overlapped']:.4f} s; bare copy {med['copy']:.3f} s ({mb / med['copy']:.0f} MB/s)")
    bench.report(Ratio.of("(a) sync save MB/s / sequential write+fsync MB/s", t["reference"], t["sync"],
                          at_least=0.7))
    bench.report(Ratio.of("(b) async save stall / sync save", t["async"], t["sync"], at_most=0.1,
                          note="copy inside the stall; its floor is (d)"))
    bench.report(Ratio.of("(c) overlapped staging: save stall / sync save", t["overlapped"], t["sync"], at_most=0.1,
                          note="what the trainer's step sees; the copy must also hide behind forward+backward"))
    bench.report(Ratio.of("(c) overlapped staging: the copy behind forward+backward / sync save", copies, t["sync"]))
    bench.report(Ratio.of("(d) bare copy of the same bytes / sync save", t["copy"], t["sync"],
                          note="memory bandwidth vs the disk's: the floor of (b)"))
    return bench.finish()


if __name__ == "__main__":
    sys.exit(main())
