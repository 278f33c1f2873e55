"""Back up a Megatron-LM run's final checkpoint to the project's checkpoint bucket.

Megatron-LM's checkpoint layout (``--save DIR``, ``megatron/training/checkpointing.py``)::

    DIR/latest_checkpointed_iteration.txt     the newest complete iteration, e.g. "1000" (or "release")
    DIR/iter_0001000/                          that checkpoint (torch_dist: *.distcp, common.pt, metadata.json)

The batch script runs ``python -m clustertrain.megatron.backup DIR BASE_URL`` as a one-task step after a run
that trained every iteration. It copies ``iter_<N>/`` and a ``latest_checkpointed_iteration.txt`` naming it to
``BASE_URL/iter_<N>/`` (``BASE_URL`` = ``<storage.checkpoint_bucket>/<project>/<model>``, as the built-in
trainer's ``step_<N>/``), through :func:`clustertrain.storage.backup_directory` (checksum manifest, verified).
Restoring it into a run directory's ``checkpoints/`` (``clustertrain storage restore URL RUN_DIR/checkpoints``)
gives Megatron's ``--load`` exactly the layout it reads. Exit 0 with the URL printed; 2 with one line on failure.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from clustertrain.core.errors import ClusterTrainError, StorageError

LATEST = "latest_checkpointed_iteration.txt"


def latest_iteration(checkpoints: Path) -> int | None:
    """The iteration ``latest_checkpointed_iteration.txt`` names (None: absent, or ``release``)."""
    try:
        text = (Path(checkpoints) / LATEST).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None


def iteration_dir(checkpoints: Path, iteration: int) -> Path:
    return Path(checkpoints) / f"iter_{iteration:07d}"


def backup_latest(checkpoints: Path, base_url: str, options=None) -> str:
    """Copy and verify the latest checkpoint; return its URL. Raises :class:`StorageError` in one line."""
    from clustertrain.storage import backup_directory

    checkpoints = Path(checkpoints)
    iteration = latest_iteration(checkpoints)
    if iteration is None:
        raise StorageError(f"{checkpoints}: no {LATEST} naming an iteration; Megatron-LM saved no checkpoint here")
    source = iteration_dir(checkpoints, iteration)
    if not source.is_dir():
        raise StorageError(f"{checkpoints / LATEST} names iteration {iteration} but {source} does not exist")
    url = f"{base_url.rstrip('/')}/{source.name}"
    with tempfile.TemporaryDirectory(prefix=".backup-", dir=checkpoints) as staging:
        shutil.copytree(source, Path(staging) / source.name, copy_function=os.link)  # hard links: no copy on disk
        (Path(staging) / LATEST).write_text(f"{iteration}\n", encoding="utf-8")
        result = backup_directory(staging, url, options=options)
    if not result.ok:
        raise StorageError(f"the copy of {source} at {url} did not verify; run `clustertrain storage verify {url}`")
    return url


def main(argv: list[str] | None = None) -> int:
    from clustertrain.storage import StoreConfig

    ap = argparse.ArgumentParser(prog="python -m clustertrain.megatron.backup",
                                 description="Back up a Megatron-LM run's latest checkpoint (copy, then verify).")
    ap.add_argument("checkpoints", help="Megatron's --save directory")
    ap.add_argument("base_url", help="<checkpoint bucket>/<project>/<model>; the copy goes to BASE_URL/iter_<N>/")
    ap.add_argument("--endpoint-url")
    ap.add_argument("--region")
    args = ap.parse_args(argv)
    try:
        url = backup_latest(Path(args.checkpoints), args.base_url,
                            options=StoreConfig(endpoint_url=args.endpoint_url, region=args.region))
    except ClusterTrainError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    print(f"clustertrain: final checkpoint backed up to {url} (verified)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
