"""``parse_output``: tell which tool wrote a text (nccl-tests, IOR, mdtest, fio JSON) and parse it."""

from __future__ import annotations

import re
from pathlib import Path

from clustertrain.validate.nccltests import parse_nccl_tests
from clustertrain.validate.results import CollectiveRun, StorageRun, ValidateError
from clustertrain.validate.storageparse import load_json_output, parse_fio_json, parse_ior, parse_mdtest

_NCCL_MARKERS = re.compile(r"# Avg bus bandwidth|#\s+size\s+count|nccl-tests version|# nThread \d+ nGpus|"
                           r"Out of bounds values|Collective test starting|Test (CUDA |NCCL )?failure|_perf\b")


def detect_tool(text: str) -> str:
    """Return 'fio', 'ior', 'mdtest' or 'nccl-tests'; raise :class:`ValidateError` if none fits."""
    if text.lstrip().startswith("{") or re.search(r"^\{", text, re.MULTILINE):
        obj = load_json_output(text)
        if obj is not None:
            if "fio version" in obj or "jobs" in obj:
                return "fio"
            if "tests" in obj and ("summary" in obj or "Version" in obj):
                return "ior"
    if re.search(r"^IOR-\d|MPI Coordinated Test of Parallel I/O|^Max (Write|Read):|^Summary of all tests:", text, re.M):
        return "ior"
    if re.search(r"mdtest-\d|^SUMMARY rate", text, re.M):
        return "mdtest"
    if _NCCL_MARKERS.search(text):
        return "nccl-tests"
    raise ValidateError("cannot tell which tool wrote this output; expected nccl-tests, IOR, mdtest or fio JSON "
                        "(fio needs --output-format=json)")


def parse_output(text: str) -> CollectiveRun | StorageRun:
    """Parse benchmark output of any supported tool; ``.failed`` is the verdict, ``.problems`` says why."""
    tool = detect_tool(text)
    if tool == "fio":
        return parse_fio_json(text)
    if tool == "ior":
        return parse_ior(text)
    if tool == "mdtest":
        return parse_mdtest(text)
    return parse_nccl_tests(text)


def parse_output_file(path: str | Path) -> CollectiveRun | StorageRun:
    p = Path(path)
    try:
        text = p.read_text(errors="replace")
    except OSError as e:
        raise ValidateError(f"{p}: cannot read ({e.strerror}); give the path of a benchmark log") from None
    try:
        return parse_output(text)
    except ValidateError as e:
        raise ValidateError(f"{p}: {e}") from None
