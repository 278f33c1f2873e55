"""Background checkpoint backup: is a training step slower while a checkpoint is being uploaded?

    .venv/bin/python bench/backup_overhead.py [--steps 60] [--repeats 2]

Runs the real trainer (`clustertrain run`, gloo ranks) twice per repeat, alternating: without a
checkpoint bucket, and with `training.backup_every: 1` to moto's S3 server on 127.0.0.1 (real HTTP;
the uploader is the real child process). Both save a checkpoint every `--ckpt` steps. Each step's
own time comes from metrics.jsonl (`step_time_s`: the step's compute, excluding the save itself);
a step of the backup run counts as "during an upload" when its interval overlaps an upload's
[started, finished] from status.json. Figures: median step time of the no-backup runs, of the
backup runs' steps during uploads, and their ratio (target <= 1.05; on a 2-core machine the S3
server and the uploader share the cores with the ranks, which is harsher than a GPU node).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROJECT = """
name: bench
cluster: {{backend: local, gpus_per_node: 0, procs_per_node: {procs}, threads_per_worker: 1}}
storage: {{root: {root}{bucket}}}
models:
  - name: m
    model: {{layers: 4, hidden: {hidden}, heads: 4, seq_len: 128}}
    training: {{max_steps: {steps}, micro_batch: 8, global_batch: {gb}, checkpoint_every: {ckpt}, keep_last: 2,
               log_every: 1, seed: 1{backup}}}
"""


def run(workdir: Path, args, endpoint: str | None, tag: str) -> tuple[list[dict], list[dict]]:
    bucket = f', checkpoint_bucket: "s3://bench/ckpt", endpoint_url: "{endpoint}"' if endpoint else ""
    project = workdir / f"{tag}.yaml"
    project.write_text(PROJECT.format(procs=args.procs, root=json.dumps(str(workdir / "fsx")), bucket=bucket,
                                      hidden=args.hidden, steps=args.steps, gb=8 * args.procs, ckpt=args.ckpt,
                                      backup=", backup_every: 1" if endpoint else ""))
    run_dir = workdir / tag
    subprocess.run([sys.executable, "-m", "clustertrain", "run", str(project), "--run-dir", str(run_dir)], check=True,
                   stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    status = json.loads((run_dir / "status.json").read_text())
    return rows, status.get("backups") or []


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--ckpt", type=int, default=5)
    ap.add_argument("--procs", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()

    import boto3

    from tests.support.s3server import dummy_env, s3_server

    import os
    os.environ.update(dummy_env())
    plain: list[float] = []
    during: list[float] = []
    outside: list[float] = []
    uploads: list[float] = []
    sizes = []
    with s3_server() as endpoint, tempfile.TemporaryDirectory() as tmp:
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="bench")
        for r in range(args.repeats):
            rows, _ = run(Path(tmp), args, None, f"plain-{r}")
            plain += [row["step_time_s"] for row in rows if row["step"] > args.warmup]
            rows, backups = run(Path(tmp), args, endpoint, f"backup-{r}")
            spans = [(b["started"], b["finished"]) for b in backups if b.get("started")]
            uploads += [b["seconds"] for b in backups if b.get("seconds")]
            for row in rows:
                if row["step"] <= args.warmup:
                    continue
                end, start = row["time"], row["time"] - row["step_time_s"]
                hit = any(s < end and start < f for s, f in spans)
                (during if hit else outside).append(row["step_time_s"])
            ck = sorted((Path(tmp) / f"backup-{r}" / "checkpoints").glob("step_*"))
            sizes.append(sum(p.stat().st_size for p in ck[-1].iterdir()) if ck else 0)
    med = statistics.median
    print(f"model: GPT 4x{args.hidden}, seq 128, micro_batch 8, {args.procs} gloo rank(s) x 1 thread; checkpoint every "
          f"{args.ckpt} steps ({sizes[-1] / 2**20:.1f} MiB), backup_every 1 to moto S3 on 127.0.0.1; {args.repeats} repeats")
    print(f"uploads: {len(uploads)}, median {med(uploads):.2f} s each" if uploads else "uploads: none")
    print(f"step, no backup               : {med(plain) * 1e3:8.1f} ms  (n={len(plain)})")
    print(f"step, backup run, during upload: {med(during) * 1e3:8.1f} ms  (n={len(during)})" if during else
          "step during upload: none overlapped")
    print(f"step, backup run, no upload    : {med(outside) * 1e3:8.1f} ms  (n={len(outside)})" if outside else "")
    if during:
        print(f"ratio during-upload / no-backup: {med(during) / med(plain):.3f}   target <= 1.05")


if __name__ == "__main__":
    main()
