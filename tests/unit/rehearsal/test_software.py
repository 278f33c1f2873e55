"""A rehearsal node's fresh /tmp must not hide the interpreter running the rehearsal (a checkout under /tmp, as CI's)."""

from __future__ import annotations

import sys

from clustertrain.rehearsal.run import software_dirs


def test_a_virtual_environment_under_tmp_is_bound_and_nested_ones_are_not_repeated(monkeypatch, tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    monkeypatch.setattr(sys, "prefix", str(venv))
    monkeypatch.setattr(sys, "base_prefix", str(tmp_path))  # the outer directory covers the venv inside it
    dirs = software_dirs()
    assert str(tmp_path.resolve()) in dirs
    assert str(venv.resolve()) not in dirs


def test_nothing_is_bound_for_software_outside_tmp_and_run(monkeypatch):
    monkeypatch.setattr(sys, "prefix", "/usr")
    monkeypatch.setattr(sys, "base_prefix", "/usr")
    assert all(not d.startswith("/usr") for d in software_dirs())
