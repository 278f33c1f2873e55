"""Storage bench on a tmp dir, with fio (when installed) and with the Python fallback."""

from __future__ import annotations

import shutil

import pytest

from clustertrain.validate import StorageBenchConfig, ValidateError, run_storage_bench


def _check(res):
    assert res.write_mib_s > 0 and res.read_mib_s > 0
    assert res.create_per_s > 0 and res.stat_per_s > 0 and res.unlink_per_s > 0


def test_python_fallback(tmp_path):
    run = run_storage_bench([tmp_path], StorageBenchConfig(size_mib=4, files=50, engine="python"))
    assert not run.failed and run.tool == "python"
    _check(run.results[0])
    assert list(tmp_path.iterdir()) == []  # work dir removed


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio not installed (apt-get install -y fio)")
def test_fio_engine(tmp_path):
    run = run_storage_bench([tmp_path], StorageBenchConfig(size_mib=4, files=50, engine="fio"))
    assert not run.failed and run.tool == "fio", run.problems
    res = run.results[0]
    _check(res)
    assert res.ops["fio_write"]["io_bytes"] == 4 * 1024 * 1024 and any("fio-" in n for n in res.notes)


def test_bad_path_is_clear(tmp_path):
    with pytest.raises(ValidateError, match="not a directory"):
        run_storage_bench([tmp_path / "missing"], StorageBenchConfig(size_mib=1, files=1))
