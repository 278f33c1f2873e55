"""The moto release the test server's fixes patch (tests/support/moto_cfn_server.py ``MOTO_VERSION``) is the one
pyproject.toml's test extra pins, and the server refuses any other in one line."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "tests" / "support" / "moto_cfn_server.py"


def moto_version() -> str:
    """``MOTO_VERSION`` as written in the server module, read without importing it (which would import moto)."""
    for node in ast.parse(SERVER.read_text()).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["MOTO_VERSION"]:
            return ast.literal_eval(node.value)
    raise AssertionError(f"{SERVER} has no MOTO_VERSION = '...'")


def test_pyproject_pins_the_moto_the_fixes_are_written_for():
    test_extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    [moto] = [r for r in map(Requirement, test_extra) if r.name == "moto"]
    assert (moto.extras, str(moto.specifier)) == ({"server"}, f"=={moto_version()}")


def test_another_moto_stops_the_server_in_one_line():
    probe = ("import importlib.metadata as m, runpy; m.version = lambda name: '5.1.0'; "
             "runpy.run_module('tests.support.moto_cfn_server', run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=60)
    needed = moto_version()
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == (f"tests.support.moto_cfn_server patches moto {needed}'s internals, but moto 5.1.0 is "
                           f"installed: pip install 'moto[server]=={needed}'\n")
