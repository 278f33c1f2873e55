"""What a directory holds, to assert that a refused command wrote, moved and deleted nothing."""

from __future__ import annotations

import hashlib
from pathlib import Path


def snapshot(root: Path) -> dict[str, str]:
    """Every file and directory below ``root``: content hash and mtime (a rewrite with equal bytes counts too)."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        digest = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
        out[str(p.relative_to(root))] = f"{digest} {st.st_mtime_ns}"
    return out
