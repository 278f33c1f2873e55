"""The long options Megatron-LM's argument parser accepts at :data:`~clustertrain.megatron.config.MEGATRON_TAG`.

Data, not code: ``flags-<tag>.txt`` beside this module lists the option strings of
``add_megatron_arguments`` (``megatron/training/arguments.py``), one per line (``#`` starts a comment).
A test builds the parser from the tagged source and compares, so the list cannot drift from the tag;
``megatron.extra_args`` is checked against it without Megatron-LM installed.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from clustertrain.megatron.config import MEGATRON_TAG

FLAGS_FILE = Path(__file__).with_name(f"flags-{MEGATRON_TAG}.txt")


@lru_cache(maxsize=1)
def known_options() -> frozenset[str]:
    lines = FLAGS_FILE.read_text(encoding="utf-8").splitlines()
    return frozenset(line.strip() for line in lines if line.strip() and not line.startswith("#"))
