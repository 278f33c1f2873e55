"""Squashfs images made with the REAL ``mksquashfs``, and doubles for ``docker`` and ``enroot``.

Docker and Enroot cannot run here (no Docker daemon, no NGC registry, no Enroot), so ``image build`` tests put
these small shell scripts first on PATH instead:

* ``docker``: appends ``docker <argv>`` to the log; ``info`` and ``build`` succeed. ``FAKE_DOCKER_INFO_FAIL``
  makes ``info`` fail with its text on stderr, ``FAKE_DOCKER_BUILD_FAIL`` makes ``build`` fail that way.
* ``enroot``: appends ``enroot <argv>`` and its ENROOT_* variables to the log; for ``import --output FILE URI``
  it refuses when ``FILE`` exists (as real enroot does: src/docker.sh "File already exists") or when an
  ENROOT_*_PATH is unset, then writes ``FILE`` with the real ``mksquashfs`` from a tree holding
  ``FAKE_ENROOT_PATHS`` (default: the image interpreter). ``FAKE_ENROOT_TRUNCATE=1`` cuts the file to 100
  bytes after writing it (a full disk, a killed import).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

INTERPRETER = "/opt/clustertrain/venv/bin/python"


def need_mksquashfs() -> str:
    path = shutil.which("mksquashfs")
    if path is None:
        pytest.skip("mksquashfs (apt package squashfs-tools) is not installed: bash scripts/test.sh installs it")
    return path


def make_tree(root: Path, paths: tuple[str, ...] = (INTERPRETER,)) -> Path:
    """A small file tree holding each of ``paths`` (absolute, inside the tree) as a file."""
    for p in paths:
        f = root / p.lstrip("/")
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("#!/bin/sh\n")
    return root


def mksquashfs(tree: Path, out: Path, comp: str = "lzo") -> Path:
    """``mksquashfs TREE OUT -comp COMP`` (Enroot's default options: lzo, -noD)."""
    subprocess.run([need_mksquashfs(), str(tree), str(out), "-comp", comp, "-noD", "-noappend", "-no-progress",
                    "-quiet"], check=True, capture_output=True)
    return out


_DOCKER = """#!/bin/bash
echo "docker $*" >>{log}
case "$1" in
  info) if [ -n "${{FAKE_DOCKER_INFO_FAIL:-}}" ]; then echo "$FAKE_DOCKER_INFO_FAIL" >&2; exit 1; fi; echo "Server Version: fake";;
  build) echo "#1 building (fake docker)"
         if [ -n "${{FAKE_DOCKER_BUILD_FAIL:-}}" ]; then echo "$FAKE_DOCKER_BUILD_FAIL" >&2; exit 1; fi;;
  *) echo "fake docker: unexpected $1" >&2; exit 3;;
esac
"""

_ENROOT = """#!/bin/bash
set -eu
echo "enroot $* CACHE=${{ENROOT_CACHE_PATH:-}} DATA=${{ENROOT_DATA_PATH:-}} TEMP=${{ENROOT_TEMP_PATH:-}}" >>{log}
[ "$1" = import ] && [ "$2" = --output ] || {{ echo "fake enroot: unexpected $*" >&2; exit 3; }}
out=$3
for v in ENROOT_CACHE_PATH ENROOT_DATA_PATH ENROOT_TEMP_PATH; do
  [ -n "${{!v:-}}" ] || {{ echo "fake enroot: $v is not set" >&2; exit 4; }}
done
[ ! -e "$out" ] || {{ echo "[ERROR] File already exists: $out" >&2; exit 1; }}
tree=$(mktemp -d)
for p in ${{FAKE_ENROOT_PATHS:-{interpreter}}}; do mkdir -p "$tree$(dirname "$p")"; echo '#!/bin/sh' >"$tree$p"; done
{mksquashfs} "$tree" "$out" -comp lzo -noD -noappend -no-progress -quiet >/dev/null
rm -rf "$tree"
if [ -n "${{FAKE_ENROOT_TRUNCATE:-}}" ]; then truncate -s 100 "$out"; fi
echo "fake enroot: wrote $out"
"""


def install_fake_docker(bin_dir: Path, log: Path) -> Path:
    return _script(bin_dir / "docker", _DOCKER.format(log=shlex.quote(str(log))))


def install_fake_enroot(bin_dir: Path, log: Path) -> Path:
    return _script(bin_dir / "enroot", _ENROOT.format(log=shlex.quote(str(log)), interpreter=INTERPRETER,
                                                      mksquashfs=shlex.quote(need_mksquashfs())))


def _script(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path
