"""scripts/gpu_report.py, the section scripts/gpu-check.sh adds to docs/gpu.md: from a JUnit XML that a real pytest
run writes here (one test passes, one fails, one skips) and bench/mfu.py's ``--json`` figures — recorded from a CPU
smoke run of the bench on this machine (``bench/mfu.py --device cpu --layers 2 --hidden 64 --heads 4 --seq-len 32
--micro-batch 2 --steps 3 --warmup 1 --json``; no MFU or memory on CPU, so those rows read n/a or are left out) —
the section lands after the page's introduction, before the older sections."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_section_reports_tests_and_figures_newest_first(tmp_path):
    tests = tmp_path / "t" / "test_three.py"
    tests.parent.mkdir()
    tests.write_text("import pytest\n\ndef test_ok():\n    pass\n\ndef test_bad():\n    assert 1 == 2\n\n"
                     "@pytest.mark.skip(reason='needs CUDA')\ndef test_gpu():\n    pass\n")
    xml = tmp_path / "gpu-tests.xml"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml", str(xml),
                          str(tests)], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 1 and xml.is_file()
    docs = tmp_path / "gpu.md"
    docs.write_text("# GPU figures\n\nintro\n\n## 2026-01-01 — an older section\n\nold\n")
    section = tmp_path / "section.md"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_report.py"), "--tests", str(xml),
                           "--mfu", str(ROOT / "tests" / "unit" / "fixtures" / "mfu-cpu-smoke.json"),
                           "--bench-args", "--steps 3", "--seconds", "61", "--section", str(section),
                           "--docs", str(docs), "--machine", "a test machine"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    text = docs.read_text()
    assert text.index("intro") < text.index("— a test machine") < text.index("an older section")
    new = section.read_text()
    assert "1 passed, 1 failed, 1 skipped" in new
    assert "| `test_three::test_bad` | failed |" in new and "assert 1 == 2" in new
    assert "trainer ÷ bare | **0.132**" in new and "n/a MFU" in new
    assert "peak allocated" not in new  # no GPU memory in a CPU run
    assert "async save blocks the loop | 0.01 s = **0.05 steps**" in new
