"""Megatron-LM's start-up in a read-only image (issue 37, blocker 1), in the stand-in for Pyxis
(clustertrain/launch/container_view.py).

``python /opt/megatron-lm/pretrain_gpt.py`` puts the checkout first on ``sys.path``, so the checkout's
``megatron.core`` is what gets imported, and rank 0's start-up (``megatron/training/initialize.py``
``_compile_dependencies``) calls ``compile_helpers()`` (``megatron/core/datasets/utils.py``): ``make -C`` in the
imported ``megatron/core/datasets``. Here the checkout is the test material's ``megatron/training`` and
``pretrain_gpt.py`` with ``megatron-core==0.16.1``'s ``megatron/core`` (the same tag), and ``compile_helpers`` is
that package's own function, run as ``pretrain_gpt.py`` would import it. The real pretrain_gpt.py cannot get that
far on a CPU machine: ``initialize_megatron`` asserts CUDA first.

Double: the ``Makefile`` of ``megatron/core/datasets``, which neither the tarball nor the wheel carries. The
stand-in below has the same shape (one target built from ``helpers.cpp``, ``default`` naming it) but copies
instead of compiling (pybind11 is not installed here): what matters is that ``make`` writes its target only when it
is out of date.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from clustertrain.launch.sbatch import view_prefix
from tests.support.megatron_lm import megatron_source

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the container view needs root (a mount namespace)")

STAND_IN_MAKEFILE = """\
# clustertrain test stand-in for Megatron-LM's megatron/core/datasets/Makefile (not in the test material)
OUT = helpers_stand_in.so
default: $(OUT)
$(OUT): helpers.cpp
\tcp helpers.cpp $@
"""
STARTUP = """\
import sys
sys.path.insert(0, sys.argv[1])  # what `python CHECKOUT/pretrain_gpt.py` does
import megatron.core.datasets.utils as utils
assert utils.__file__.startswith(sys.argv[1]), utils.__file__
print("compile_helpers from", utils.__file__, flush=True)
utils.compile_helpers()
print("start-up past compile_helpers", flush=True)
"""


def checkout(tmp_path: Path) -> Path:
    """A Megatron-LM checkout as the image recipe clones it (no helper built)."""
    import megatron.core

    top = megatron_source(tmp_path)
    core = top / "megatron" / "core"
    shutil.copytree(Path(megatron.core.__file__).parent, core, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    (core / "datasets" / "Makefile").write_text(STAND_IN_MAKEFILE)
    return top


def start_rank0(top: Path) -> subprocess.CompletedProcess:
    """Rank 0's start-up in the container view: the checkout is part of the (read-only) image."""
    argv = [*view_prefix(), f"--image-path={top}", "--no-container-mount-home", "--",
            sys.executable, "-c", STARTUP, str(top)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def test_megatron_rank0_startup_fails_in_a_read_only_image_until_the_image_builds_the_helper(tmp_path):
    top = checkout(tmp_path)
    datasets = top / "megatron" / "core" / "datasets"
    before = start_rank0(top)
    # the image as before issue 37: rank 0's make writes into the image, which Pyxis mounts read-only
    assert before.returncode == 1, before.stdout + before.stderr
    assert f"compile_helpers from {datasets}/utils.py" in before.stdout
    assert "Read-only file system" in before.stderr and "helpers_stand_in.so" in before.stderr, before.stderr
    assert "start-up past compile_helpers" not in before.stdout
    assert not (datasets / "helpers_stand_in.so").exists()

    # the fix (clustertrain/image/templates/Dockerfile.j2): `make -C .../megatron/core/datasets` at build time,
    # checked by `make -q`; at start-up make then finds the target up to date and writes nothing
    subprocess.run(["make", "-C", str(datasets)], check=True, capture_output=True)
    assert subprocess.run(["make", "-q", "-C", str(datasets)]).returncode == 0
    built = (datasets / "helpers_stand_in.so").stat().st_mtime_ns
    after = start_rank0(top)
    assert after.returncode == 0, after.stdout + after.stderr
    assert "start-up past compile_helpers" in after.stdout
    assert (datasets / "helpers_stand_in.so").stat().st_mtime_ns == built
