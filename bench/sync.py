"""Bench: `clustertrain storage sync` vs `aws s3 sync` and vs a boto3 ``upload_file`` loop, same moto S3 server, one run.

    python bench/sync.py [--rounds 3] [--files 1000] [--large 3] [--jobs 8] [--checkpoint [--checkpoint-mb 2048]]

Targets (issue 40, item 5), each a ratio of wall times measured side by side, the sides interleaved per round
(bench/harness.py), every side into a fresh destination prefix, with checksums kept (our side hashes every file
from cold — the hash cache is removed before each run — writes the manifest last, and sends SHA-256 as metadata and
as S3's own checksum):

- ``aws s3 sync`` time / ``clustertrain storage sync`` time >= 1.5 on 1,000 x 4 KiB files and on 3 x 50 MB files
  (both whole commands, start-up included). The reference is the ``aws`` on PATH (this machine: AWS CLI v1,
  pip ``awscli``; v2 is not on PyPI); its version is printed.
- boto3 ``upload_file`` loop time / ``clustertrain.storage.sync()`` time >= 2 on the 1,000 files (both in-process).
- ``--checkpoint``: a checkpoint-sized directory (``--checkpoint-mb`` over ``--shards`` files, default 2048 MB /
  256 shards) by ``aws s3 cp --recursive`` vs ours: measured (no target), with both rates printed.

The server is moto on 127.0.0.1 (tests/support/s3server.py), dummy credentials. moto is a Python process: on a
2-core machine its own CPU per request (~2.5 ms a PUT, ~6 ms per MB, measured) is a floor under every side, so
these ratios say how much client overhead each side adds, not what AWS would do (docs/storage.md).
``--smoke`` runs every case at a tiny size, one round.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import Bench, Ratio, interleave

from tests.support.s3server import dummy_env, s3_server

ROOT = Path(__file__).resolve().parents[1]
BUCKET = "bench"
CACHE = ".clustertrain-hashcache.json"


def make_tree(root: Path, files: int, size: int, *, dirs: int = 16, stem: str = "f") -> Path:
    for i in range(files):
        p = root / f"d{i % dirs:02d}" / f"{stem}{i:05d}.bin"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(os.urandom(size))
    return root


def aws_command() -> list[str] | None:
    found = shutil.which("aws") or (str(Path(sys.executable).with_name("aws"))
                                     if Path(sys.executable).with_name("aws").exists() else None)
    return [found] if found else None


def ours_command() -> list[str]:
    exe = Path(sys.executable).with_name("clustertrain")
    return [str(exe)] if exe.exists() else [sys.executable, "-c", "from clustertrain.cli import main; main()"]


class Sides:
    """The sides of every case, each run into a fresh prefix (a counter) of one bucket on one server."""

    def __init__(self, endpoint: str, jobs: int):
        import boto3

        self.endpoint, self.jobs, self.n = endpoint, jobs, 0
        self.env = dummy_env()
        self.client = boto3.client("s3", endpoint_url=endpoint)
        self.client.create_bucket(Bucket=BUCKET)
        self.aws = aws_command()

    def prefix(self, side: str) -> str:
        self.n += 1
        return f"{side}-{self.n}"

    def _run(self, cmd: list[str]) -> float:
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        took = time.perf_counter() - t0
        if proc.returncode:
            raise SystemExit(f"{' '.join(cmd[:4])} ... exited {proc.returncode}: {proc.stderr[-2000:]}")
        return took

    def ours_cli(self, src: Path, cleanup: bool = False) -> float:
        (src / CACHE).unlink(missing_ok=True)  # cold: every file hashed, as on a first sync
        prefix = self.prefix("ours")
        took = self._run([*ours_command(), "storage", "sync", str(src), f"s3://{BUCKET}/{prefix}",
                          "--endpoint-url", self.endpoint, "--jobs", str(self.jobs)])
        self.check_ours(prefix, src)
        if cleanup:
            self.remove(prefix)
        return took

    def ours_api(self, src: Path) -> float:
        from clustertrain.storage import StoreConfig, sync

        (src / CACHE).unlink(missing_ok=True)
        prefix = self.prefix("api")
        t0 = time.perf_counter()
        sync(src, f"s3://{BUCKET}/{prefix}", jobs=self.jobs, options=StoreConfig(endpoint_url=self.endpoint))
        return time.perf_counter() - t0

    def aws_sync(self, src: Path, verb: str = "sync", cleanup: bool = False) -> float:
        prefix = self.prefix("aws")
        args = ["s3", "sync"] if verb == "sync" else ["s3", "cp", "--recursive"]
        took = self._run([*self.aws, *args, str(src), f"s3://{BUCKET}/{prefix}", "--endpoint-url", self.endpoint,
                          "--only-show-errors"])
        if cleanup:
            self.remove(prefix)
        return took

    def boto3_loop(self, files: list[tuple[Path, str]]) -> float:
        prefix = self.prefix("loop")
        t0 = time.perf_counter()
        for path, key in files:
            self.client.upload_file(str(path), BUCKET, f"{prefix}/{key}")
        return time.perf_counter() - t0

    def check_ours(self, prefix: str, src: Path) -> None:
        """Checksums kept: the manifest is there, and one object carries its sha256 as metadata and S3 checksum."""
        import base64
        import hashlib

        self.client.head_object(Bucket=BUCKET, Key=f"{prefix}/.clustertrain-manifest.json")
        one = min((p for p in src.rglob("*.bin")), key=lambda p: p.stat().st_size)
        key = f"{prefix}/{one.relative_to(src).as_posix()}"
        head = self.client.head_object(Bucket=BUCKET, Key=key, ChecksumMode="ENABLED")
        digest = hashlib.sha256(one.read_bytes()).digest()
        assert head["Metadata"].get("sha256") == digest.hex(), (key, head["Metadata"])
        if one.stat().st_size < 64 * 2**20:  # one PUT (StoreConfig.multipart_threshold_mb): a full-object checksum
            assert head.get("ChecksumSHA256") == base64.b64encode(digest).decode(), (key, head.get("ChecksumSHA256"))
        else:  # multipart: S3's checksum covers the parts
            assert head.get("ChecksumSHA256"), (key, head)

    def remove(self, prefix: str) -> None:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix + "/")
        for page in pages:
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                self.client.delete_objects(Bucket=BUCKET, Delete={"Objects": keys, "Quiet": True})


def main() -> int:
    bench = Bench("sync", __doc__, rounds=3)
    bench.parser.add_argument("--files", type=int, default=1000, help="small files (default %(default)s)")
    bench.parser.add_argument("--size", type=int, default=4096, help="bytes per small file (default %(default)s)")
    bench.parser.add_argument("--large", type=int, default=3, help="large files (default %(default)s)")
    bench.parser.add_argument("--large-mb", type=int, default=50, help="MB per large file (default %(default)s)")
    bench.parser.add_argument("--jobs", type=int, default=8, help="our --jobs (default %(default)s)")
    bench.parser.add_argument("--checkpoint", action="store_true", help="add the checkpoint-sized case")
    bench.parser.add_argument("--checkpoint-mb", type=int, default=2048, help="its total MB (default %(default)s)")
    bench.parser.add_argument("--shards", type=int, default=256, help="its shard files (default %(default)s)")
    args = bench.parse()
    if bench.smoke:
        args.files, args.large, args.large_mb, args.checkpoint, args.checkpoint_mb, args.shards = 20, 1, 2, True, 4, 8
    os.environ.update(dummy_env())
    with tempfile.TemporaryDirectory(prefix="ct-bench-sync-") as tmp, s3_server() as endpoint:
        tmp_path = Path(tmp)
        small = make_tree(tmp_path / "small", args.files, args.size)
        large = tmp_path / "large"
        large.mkdir()
        for i in range(args.large):
            (large / f"large-{i}.bin").write_bytes(os.urandom(args.large_mb * 10**6))
        sides = Sides(endpoint, args.jobs)
        if sides.aws:
            version = subprocess.run([*sides.aws, "--version"], capture_output=True, text=True, env=sides.env)
            print(f"reference: {sides.aws[0]}: {(version.stdout or version.stderr).strip()}", flush=True)
        else:
            print("reference: no `aws` on PATH (pip install awscli): the aws s3 sync ratios are skipped", flush=True)
        small_files = [(p, p.relative_to(small).as_posix()) for p in sorted(small.rglob("*.bin"))]
        shape = f"{args.files} x {args.size // 1024} KiB"
        runs = {"ours": lambda: sides.ours_cli(small), "api": lambda: sides.ours_api(small),
                "loop": lambda: sides.boto3_loop(small_files)}
        if sides.aws:
            runs["aws"] = lambda: sides.aws_sync(small)
        t = interleave(runs, rounds=args.rounds)
        if sides.aws:
            bench.report(Ratio.of(f"{shape}: aws s3 sync time / clustertrain storage sync time", t["aws"], t["ours"],
                                  at_least=1.5, note=f"ours {min(t['ours']):.2f}-{max(t['ours']):.2f} s"))
        bench.report(Ratio.of(f"{shape}: boto3 upload_file loop time / sync() time", t["loop"], t["api"], at_least=2,
                              note=f"sync() {min(t['api']):.2f}-{max(t['api']):.2f} s"))
        if sides.aws:
            t = interleave({"ours": lambda: sides.ours_cli(large), "aws": lambda: sides.aws_sync(large)},
                           rounds=args.rounds)
            bench.report(Ratio.of(f"{args.large} x {args.large_mb} MB: aws s3 sync time / clustertrain storage sync "
                                  "time", t["aws"], t["ours"], at_least=1.5,
                                  note=f"ours {min(t['ours']):.2f}-{max(t['ours']):.2f} s"))
        if args.checkpoint and sides.aws:
            shutil.rmtree(small)
            shutil.rmtree(large)
            ckpt = make_tree(tmp_path / "ckpt", args.shards, args.checkpoint_mb * 10**6 // args.shards, dirs=8,
                             stem="__0_")
            mb = args.checkpoint_mb
            t = interleave({"ours": lambda: sides.ours_cli(ckpt, cleanup=True),
                            "aws": lambda: sides.aws_sync(ckpt, "cp", cleanup=True)}, rounds=args.rounds)
            bench.report(Ratio.of(f"checkpoint {mb} MB in {args.shards} shards: aws s3 cp --recursive time / "
                                  "clustertrain storage sync time", t["aws"], t["ours"],
                                  note=f"ours {mb / max(t['ours']):.0f}-{mb / min(t['ours']):.0f} MB/s, aws s3 cp "
                                       f"{mb / max(t['aws']):.0f}-{mb / min(t['aws']):.0f} MB/s"))
    return bench.finish()


if __name__ == "__main__":
    sys.exit(main())
