"""Golden files for generated scripts and configs: a rendered text must equal its file under ``golden/``;
``CLUSTERTRAIN_UPDATE_GOLDEN=1`` rewrites the files (review the diff before committing)."""

from __future__ import annotations

import os
from pathlib import Path


def check_golden(path: Path, text: str) -> None:
    if os.environ.get("CLUSTERTRAIN_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} missing; run with CLUSTERTRAIN_UPDATE_GOLDEN=1 once and review it"
    assert text == path.read_text(), f"rendered text differs from {path}; if intended, regenerate with CLUSTERTRAIN_UPDATE_GOLDEN=1"
