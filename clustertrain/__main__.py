"""``python -m clustertrain``. A rank's command, ``train --run-dir DIR --model NAME`` (what the local launcher, the
batch script's ``srun`` and torchrun start on every rank), goes straight to the per-rank entry point: it skips the
whole command-line app (typer, pydantic's CLI models, every command module: ~0.35 s per rank, on cores the ranks
share). Anything else — ``train --help`` included — is the ``clustertrain`` command."""

import sys


def _rank_arguments(argv: list[str]) -> tuple[str, str] | None:
    """(run_dir, model) when ``argv`` is exactly ``train --run-dir DIR --model NAME`` (either order), else None."""
    if len(argv) != 5 or argv[0] != "train":
        return None
    given = dict(zip(argv[1::2], argv[2::2]))
    if set(given) != {"--run-dir", "--model"} or any(v.startswith("-") for v in given.values()):
        return None
    return given["--run-dir"], given["--model"]


_rank = _rank_arguments(sys.argv[1:])
if _rank is not None:
    from pathlib import Path

    from clustertrain.train.entry import main as _train_main

    sys.exit(_train_main(Path(_rank[0]), _rank[1]))

from clustertrain.cli import main  # noqa: E402

main()
