"""The stand-in for Pyxis (clustertrain/launch/container_view.py): a real mount namespace per command, checked from
inside (what the command can write, see and read) and outside (nothing leaks to this machine). Root only, as the
local Slurm runs its jobs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the container view needs root (a mount namespace)")


def view(args: list[str], script: str, *, env: dict | None = None, cwd: Path | None = None):
    argv = [sys.executable, "-m", "clustertrain.launch.container_view", *args, "--", "bash", "-c", script]
    return subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **(env or {})}, cwd=cwd,
                          timeout=60)


def test_only_the_mounts_are_writable_and_the_root_is_read_only(tmp_path):
    shared, beside = tmp_path / "fsx", tmp_path / "beside"
    shared.mkdir()
    beside.mkdir()
    out = view([f"--container-mounts={shared}:{shared}", f"--container-workdir={shared}", "--no-container-mount-home"],
               f"echo ok > in-mount.txt; touch {beside}/x; touch /usr/clustertrain-view-test; pwd")
    assert (shared / "in-mount.txt").read_text() == "ok\n"
    assert not (beside / "x").exists() and not Path("/usr/clustertrain-view-test").exists()
    # beside the mount is under /tmp here: hidden by the view's own /tmp; /usr is the read-only image root
    assert f"touch: cannot touch '{beside}/x': No such file or directory" in out.stderr, out.stderr
    assert "touch: cannot touch '/usr/clustertrain-view-test': Read-only file system" in out.stderr, out.stderr
    assert out.stdout.strip().splitlines()[-1] == str(shared)


def test_home_is_not_mounted_unless_asked(tmp_path):
    home = Path("/root") if os.environ.get("HOME", "/root") == "/root" else Path(os.environ["HOME"])
    probe = home / f".clustertrain-view-probe-{os.getpid()}"
    out = view(["--no-container-mount-home"], f'touch "$HOME/{probe.name}"; ls -A "$HOME" | wc -l')
    assert f"touch: cannot touch '{probe}': Read-only file system" in out.stderr, out.stderr
    assert out.stdout.split()[-1] == "0"  # the host's home directory is hidden, not just read-only
    assert not probe.exists()
    writable = view(["--container-mount-home"], f'touch "$HOME/{probe.name}" && echo wrote')
    try:
        assert writable.stdout.strip() == "wrote", writable.stderr
        assert probe.exists()
    finally:
        probe.unlink(missing_ok=True)


def test_tmp_is_private_and_the_environment_passes(tmp_path):
    marker = f"clustertrain-view-{os.getpid()}"
    out = view([], f'touch /tmp/{marker} && ls /tmp && echo "$CT_VIEW_PROBE"', env={"CT_VIEW_PROBE": "from-host"})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split()
    assert marker in lines and "from-host" in lines
    assert not Path("/tmp", marker).exists()  # the view's /tmp is its own tmpfs
    assert not any(n.startswith("pytest-of") for n in lines)  # nothing of this machine's /tmp shows


def test_a_read_only_mount_flag_is_kept(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    out = view([f"--container-mounts={data}:{data}:ro"], f"touch {data}/x")
    assert f"touch: cannot touch '{data}/x': Read-only file system" in out.stderr


def test_the_stand_in_software_under_tmp_is_bound_back_read_only(tmp_path):
    soft = tmp_path / "venv"
    soft.mkdir()
    (soft / "python").write_text("#!/bin/sh\necho stand-in\n")
    (soft / "lib").mkdir()
    (soft / "lib" / "site.txt").write_text("inner\n")
    # a fresh clone in /tmp: its venv and the clone both given, one inside the other (the outer one is bound)
    out = view([f"--image-path={soft / 'lib'}", f"--image-path={soft}"], f"cat {soft}/python {soft}/lib/site.txt; touch {soft}/y")
    assert out.returncode != 125, out.stderr
    assert "echo stand-in" in out.stdout and "inner" in out.stdout
    assert f"touch: cannot touch '{soft}/y': Read-only file system" in out.stderr


@pytest.mark.parametrize("args, line", [
    (["--container-workdir=/no/such/dir"],
     "container view: --container-workdir /no/such/dir: No such file or directory in the container"),
    (["--container-mounts=/no/such/source:/no/such/source"],
     "container view: mount source /no/such/source does not exist on this node"),
    (["--container-mounts=/proc:/nowhere/in/image"], "container view: mount target /nowhere/in/image does not exist"),
    (["--container-bogus=1"], "container view: unknown option '--container-bogus=1'"),
])
def test_a_view_that_cannot_be_set_up_is_one_line_and_runs_nothing(tmp_path, args, line):
    marker = tmp_path / "ran"
    out = view(args, f"touch {marker}")
    assert out.returncode == 125
    assert out.stderr.count("\n") == 1 and out.stderr.startswith(line), out.stderr
    assert not marker.exists()
