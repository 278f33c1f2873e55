"""Checkpoint speed: sync save throughput vs a plain sequential write, and how long an async save stalls.

    .venv/bin/python bench/checkpoint.py [--mb 300] [--repeats 3] [--dir DIR]

One process, one disk (``--dir``, default a temp directory under the current one), side by side in one
run. The state is a model of Linear layers plus its AdamW moments (fp32: 3 x 4 bytes per parameter,
``--mb`` in total), saved through :class:`clustertrain.train.checkpoint.CheckpointManager` exactly as
the trainer does (DCP files, meta.json, renames, ``latest``; every file fsynced).

(a) sync save MB/s ÷ sequential write MB/s: the reference writes the same tensors' bytes, one after
    another, into one file with ``write`` calls and one ``fsync`` (the best a single writer gets from
    this disk). Target >= 0.7.
(b) async stall ÷ sync save time: the stall is how long ``save(..., async_save=True)`` blocks the
    caller (staging the state into shared CPU memory; the write then runs in the checkpoint writer
    process, :mod:`clustertrain.train.checkpoint_async`, waited for before the next round). The writer
    process is started first (``prepare_async``, as the trainer does at start-up) and its start-up time
    printed; the first async save also allocates the staging buffers (reused after), so the steady-state
    figure is the median over later saves; the first is printed beside it. Target <= 0.1.
(c) the same with overlapped staging — what the trainer does (``Trainer`` sets ``overlap_staging`` with async
    checkpoints) — (``overlap_staging``: the copy runs in the stager's thread while
    the next step's forward and backward would run; the trainer waits for it before the optimizer step):
    the stall is what ``save`` blocks; the copy's own time is printed beside it (hidden when a forward and
    backward take at least that long).

Rounds alternate (reference, sync, async) and each figure is the median over ``--repeats`` rounds;
each round deletes its files after the timed parts (``keep_last`` pruning is left out of the save time:
it deletes, it does not write). No timed asserts: this prints figures and targets.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=300, help="state size in MB (params + AdamW moments)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (copies are memory-bound; more threads spin on a busy small machine)")
    ap.add_argument("--device", default="cpu", help="where the state lives (cuda: staging is a pinned D2H copy)")
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir under .)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")  # DCP warns that it runs without a process group
    import torch

    torch.set_num_threads(args.threads)

    from clustertrain.train.checkpoint import CheckpointManager
    from clustertrain.train.checkpoint_state import TrainState, app_state

    model, opt = build_state(args.mb, args.device)
    size = state_bytes(model, opt)
    base = Path(tempfile.mkdtemp(prefix=".bench-ckpt-", dir=args.dir or Path.cwd()))
    mgr = CheckpointManager(base / "ckpt", keep_last=1000, fingerprint="f", project="bench", model_name="m", rank=0,
                            world_size=1, layout={"world": 1})
    ref_s, sync_s, stalls, overlap_stalls, copies = [], [], [], [], []
    t0 = time.perf_counter()
    mgr.prepare_async()
    mgr._async._writer.install()  # waits until the writer process runs (spawn, import torch, its gloo world)
    writer_start = time.perf_counter() - t0
    try:
        for r in range(args.repeats + 1):  # round 0 warms caches and allocates the staging buffers
            ref_file = base / "sequential.bin"
            ref = sequential_write(model, opt, ref_file)
            ref_file.unlink()
            t0 = time.perf_counter()
            mgr.save(2 * r + 1, 0, app_state(model, opt, TrainState(2 * r + 1, 0)))
            sync = time.perf_counter() - t0
            t0 = time.perf_counter()
            mgr.save(2 * r + 2, 0, app_state(model, opt, TrainState(2 * r + 2, 0)), async_save=True)
            stall = time.perf_counter() - t0
            mgr.wait()
            mgr._async.overlap = True  # (c): the same save, staging overlapped
            t0 = time.perf_counter()
            mgr.save(2 * r + 2, 0, app_state(model, opt, TrainState(2 * r + 2, 0)), async_save=True)
            overlap_stall = time.perf_counter() - t0
            mgr.staged()
            copy = time.perf_counter() - t0
            mgr.wait()
            mgr._async.overlap = False
            for old in (base / "ckpt").glob("step_*"):  # outside the timed saves (keep_last deletes are not writes)
                shutil.rmtree(old)
            if r == 0:
                first_stall = stall
                continue
            ref_s.append(ref)
            sync_s.append(sync)
            stalls.append(stall)
            overlap_stalls.append(overlap_stall)
            copies.append(copy)
    finally:
        mgr.close()
        shutil.rmtree(base, ignore_errors=True)

    mb = size / 1e6
    ref, sync, stall = statistics.median(ref_s), statistics.median(sync_s), statistics.median(stalls)
    print(f"state: {mb:.0f} MB ({sum(p.numel() for p in model.parameters()):,} parameters + AdamW moments), "
          f"on {args.device}, {args.repeats} rounds, disk of {base.parent}")
    print(f"sequential write + fsync : {ref:6.3f} s  {mb / ref:8.0f} MB/s")
    print(f"sync save (DCP, commit)  : {sync:6.3f} s  {mb / sync:8.0f} MB/s")
    print(f"async save stall         : {stall:6.3f} s  (first async save, allocating staging: {first_stall:.3f} s; "
          f"writer process start-up, off the training path: {writer_start:.2f} s)")
    print(f"(a) sync save MB/s / sequential MB/s = {ref / sync:.2f}  (target >= 0.7)")
    print(f"(b) async stall / sync save time     = {stall / sync:.3f} (target <= 0.1)")
    ostall, copy = statistics.median(overlap_stalls), statistics.median(copies)
    print(f"(c) overlapped staging: stall {ostall:.4f} s / sync save time = {ostall / sync:.3f} (target <= 0.1); "
          f"the copy, behind the next forward and backward: {copy:.3f} s")


if __name__ == "__main__":
    main()
