"""Bench: our sync of N small files vs a plain boto3 ``upload_file`` loop, same moto S3 server, one run.

    python bench/sync.py [--files 1000] [--jobs 8] [--large 0]

Prints both wall times and the ratio (target >= 2x, from concurrency). ``--large K`` adds K files of
50 MB to both sides. Dummy credentials; the server is moto on 127.0.0.1 (tests/support/s3server.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.s3server import dummy_env, s3_server  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--size", type=int, default=4096, help="bytes per small file")
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--large", type=int, default=0, help="extra 50 MB files")
    args = ap.parse_args()
    os.environ.update(dummy_env())
    import boto3

    from clustertrain.storage import StoreConfig, sync

    with tempfile.TemporaryDirectory() as tmp, s3_server() as endpoint:
        src = Path(tmp) / "src"
        files = []
        for i in range(args.files):
            p = src / f"d{i % 16:02d}" / f"f{i:05d}.bin"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(os.urandom(args.size))
            files.append(p)
        for i in range(args.large):
            p = src / f"large-{i}.bin"
            p.write_bytes(os.urandom(50 * 2**20))
            files.append(p)
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket="bench")

        t0 = time.perf_counter()
        for p in files:
            client.upload_file(str(p), "bench", "plain/" + p.relative_to(src).as_posix())
        plain = time.perf_counter() - t0

        t0 = time.perf_counter()
        result = sync(src, "s3://bench/ours", jobs=args.jobs, options=StoreConfig(endpoint_url=endpoint))
        ours = time.perf_counter() - t0
        assert result.transferred_files == len(files)

        t0 = time.perf_counter()
        again = sync(src, "s3://bench/ours", jobs=args.jobs, options=StoreConfig(endpoint_url=endpoint))
        noop = time.perf_counter() - t0
        assert again.transferred_bytes == 0

    total = result.transferred_bytes
    print(f"files: {len(files)} ({total / 2**20:.1f} MiB), jobs={args.jobs}, cores={os.cpu_count()}")
    print(f"boto3 upload_file loop : {plain:7.2f} s")
    print(f"clustertrain sync      : {ours:7.2f} s  (hashing, manifest and checksums included)")
    print(f"ratio (loop / sync)    : {plain / ours:7.2f} x   target >= 2x")
    print(f"re-sync, nothing new   : {noop:7.2f} s  (0 bytes sent)")


if __name__ == "__main__":
    main()
