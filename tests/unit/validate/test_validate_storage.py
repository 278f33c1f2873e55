"""Storage bench on a tmp dir, with fio (when installed) and with the Python fallback."""

from __future__ import annotations

import shutil

import pytest

from clustertrain.validate import StorageBenchConfig, ValidateError, run_storage_bench
from clustertrain.validate.storagebench import cache_method, supports_direct


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


@pytest.mark.parametrize("engine", ["python", pytest.param("fio", marks=pytest.mark.skipif(
    shutil.which("fio") is None, reason="fio not installed (apt-get install -y fio)"))])
def test_page_cache_is_bypassed_and_the_method_recorded(tmp_path, engine):
    """Item 10c: the read right after the write used to come from the page cache; this ext4 tmp dir takes O_DIRECT."""
    assert supports_direct(tmp_path)
    run = run_storage_bench([tmp_path], StorageBenchConfig(size_mib=4, files=20, engine=engine))
    res = run.results[0]
    assert not run.failed and res.cache_bypass == "direct" and not run.warnings, run.problems
    assert any(("direct=1" if engine == "fio" else "O_DIRECT") in n for n in res.notes)
    buffered = run_storage_bench([tmp_path], StorageBenchConfig(size_mib=4, files=20, engine=engine, cache="buffered"))
    assert buffered.results[0].cache_bypass == "none" and "page cache not bypassed" in buffered.warnings[0]


def test_cache_method_order():
    assert cache_method("auto", True, True, 1 << 20, 1 << 30) == "direct"
    assert cache_method("auto", False, True, 1 << 20, 1 << 30) == "drop_caches"
    assert cache_method("auto", False, False, 2 << 30, 1 << 30) == "larger_than_ram"
    assert cache_method("auto", False, False, 1 << 20, 1 << 30) == "none"
    assert cache_method("buffered", True, True, 1 << 20, 1 << 30) == "none"
    with pytest.raises(ValidateError, match="refuses O_DIRECT"):
        cache_method("direct", False, True, 1, 1)
    with pytest.raises(ValidateError, match="drop_caches is not writable"):
        cache_method("drop", True, False, 1, 1)
