"""Background checkpoint backup: is a training step slower while a checkpoint is being uploaded?

    flock /tmp/ct-heavy.lock .venv/bin/python bench/backup_overhead.py [--rounds 2] [--steps 60] [--ckpt 5]
    .venv/bin/python bench/backup_overhead.py --smoke     # a tiny model, a few steps, one round

Reference: the same training without a checkpoint bucket. Each round runs the real trainer (``clustertrain run``,
gloo ranks) once without a bucket and once with ``training.backup_every: 1`` to moto's S3 server on 127.0.0.1 (real
HTTP; the uploader is the real child process), the order alternating between rounds (bench/harness.py
``interleave``). Both save a checkpoint every ``--ckpt`` steps. Each step's own time comes from metrics.jsonl
(``step_time_s``: the step's compute, excluding the save itself); a step of the backup run counts as "during an
upload" when its interval overlaps an upload's [started, finished] from status.json. A round's figure: the median
step of the backup run's steps during uploads ÷ the median step of the run without backup. Target: <= 1.05 (on a
2-core machine the S3 server and the uploader share the cores with the ranks, which is harsher than a GPU node).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import ROOT, Bench, Ratio, interleave

PROJECT = """
name: bench
cluster: {{backend: local, gpus_per_node: 0, procs_per_node: {procs}, threads_per_worker: 1}}
storage: {{root: {root}{bucket}}}
models:
  - name: m
    model: {{layers: {layers}, hidden: {hidden}, heads: 4, seq_len: {seq}}}
    training: {{max_steps: {steps}, micro_batch: 8, global_batch: {gb}, checkpoint_every: {ckpt}, keep_last: 2,
               log_every: 1, seed: 1{backup}}}
"""


def run(workdir: Path, size: dict, endpoint: str | None, tag: str) -> tuple[list[dict], list[dict]]:
    """One ``clustertrain run``: its metrics rows and the uploads status.json records."""
    bucket = f', checkpoint_bucket: "s3://bench/ckpt", endpoint_url: "{endpoint}"' if endpoint else ""
    project = workdir / f"{tag}.yaml"
    project.write_text(PROJECT.format(root=json.dumps(str(workdir / "fsx")), bucket=bucket,
                                      backup=", backup_every: 1" if endpoint else "", **size))
    run_dir = workdir / tag
    proc = subprocess.run([sys.executable, "-m", "clustertrain", "run", str(project), "--run-dir", str(run_dir)],
                          cwd=ROOT, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"`clustertrain run` failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    status = json.loads((run_dir / "status.json").read_text())
    return rows, status.get("backups") or []


def main() -> int:
    bench = Bench("backup_overhead", __doc__, rounds=2)
    bench.parser.add_argument("--steps", type=int, default=60)
    bench.parser.add_argument("--ckpt", type=int, default=5, help="checkpoint every this many steps")
    bench.parser.add_argument("--procs", type=int, default=1)
    bench.parser.add_argument("--hidden", type=int, default=256)
    bench.parser.add_argument("--warmup", type=int, default=3, help="steps left out at the start")
    args = bench.parse()
    if bench.smoke:
        size = dict(procs=1, layers=1, hidden=32, seq=32, steps=6, gb=8, ckpt=2)
        warmup = 1
    else:
        size = dict(procs=args.procs, layers=4, hidden=args.hidden, seq=128, steps=args.steps, gb=8 * args.procs,
                    ckpt=args.ckpt)
        warmup = args.warmup

    import boto3

    from tests.support.s3server import dummy_env, s3_server

    os.environ.update(dummy_env())
    med = statistics.median
    plain, during, outside, uploads, sizes = [], [], [], [], []
    with s3_server() as endpoint, tempfile.TemporaryDirectory(prefix="ct-backup-overhead-") as tmp:
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="bench")
        count = iter(range(10**6))

        def without() -> float:
            rows, _ = run(Path(tmp), size, None, f"plain-{next(count)}")
            steps = [row["step_time_s"] for row in rows if row["step"] > warmup]
            plain.extend(steps)
            return med(steps)

        def with_backup() -> float:
            tag = f"backup-{next(count)}"
            rows, backups = run(Path(tmp), size, endpoint, tag)
            spans = [(b["started"], b["finished"]) for b in backups if b.get("started") and b.get("finished")]
            uploads.extend(b["seconds"] for b in backups if b.get("seconds"))
            hit, miss = [], []
            for row in rows:
                if row["step"] <= warmup:
                    continue
                end, start = row["time"], row["time"] - row["step_time_s"]
                (hit if any(s < end and start < f for s, f in spans) else miss).append(row["step_time_s"])
            during.extend(hit)
            outside.extend(miss)
            ck = sorted((Path(tmp) / tag / "checkpoints").glob("step_*"))
            sizes.append(sum(p.stat().st_size for p in ck[-1].iterdir()) if ck else 0)
            # no step overlapped an upload (a tiny smoke run): the backup run's steps stand in, so the bench runs
            return med(hit) if hit else med(miss) if miss else float("nan")

        got = interleave({"backup": with_backup, "plain": without}, bench.rounds)
    print(f"model: GPT {size['layers']}x{size['hidden']}, seq {size['seq']}, micro_batch 8, {size['procs']} gloo "
          f"rank(s) x 1 thread; checkpoint every {size['ckpt']} steps ({sizes[-1] / 2**20:.1f} MiB), backup_every 1 "
          f"to moto S3 on 127.0.0.1")
    print(f"uploads: {len(uploads)}, median {med(uploads):.2f} s each" if uploads else "uploads: none")
    print(f"step, no backup                : {med(plain) * 1e3:8.1f} ms  (n={len(plain)})")
    if during:
        print(f"step, backup run, during upload: {med(during) * 1e3:8.1f} ms  (n={len(during)})")
    if outside:
        print(f"step, backup run, no upload    : {med(outside) * 1e3:8.1f} ms  (n={len(outside)})")
    bench.report(Ratio.of("step during an upload / step without backup", got["backup"], got["plain"], at_most=1.05,
                          note=f"{len(during)} of {len(during) + len(outside)} backup-run steps overlapped an upload"))
    return bench.finish()


if __name__ == "__main__":
    sys.exit(main())
