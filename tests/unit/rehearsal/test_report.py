"""The rehearsal's printed report: the table (header, jobs, checks with their details) and the summary line."""

from __future__ import annotations

from clustertrain.rehearsal.observed import Check, RehearsalReport
from clustertrain.rehearsal.report import WIDTH, render_table, status, summary_line

NAMES = ["booted", "concurrent", "world", "rendezvous", "one_gpu", "gpus_unshared", "dirs", "paths", "preset",
         "secrets"]
JOBS = [{"model": f"model-{i}", "job_id": str(100 + i), "planned_nodes": 11, "state": "RUNNING", "reason": None,
         "nodes": [f"gpu-queue-st-p5e-48xlarge-{n}" for n in range(11 * i + 1, 11 * i + 12)]} for i in range(7)]


def report(failed: dict[str, list[str]] | None = None, skipped: set[str] = frozenset(), jobs=JOBS) -> RehearsalReport:
    failed = failed or {}
    checks = [Check(name=n, title=f"what {n} asserts, in one line", ok=None if n in skipped else n not in failed,
                    details=failed.get(n, ["the jobs were not run: a node did not boot"] if n in skipped else []))
              for n in NAMES]
    return RehearsalReport(project="flagship", nodes=80, gpus=640, wall_s=52.4, checks=checks, jobs=list(jobs))


def test_status_words():
    assert [status(Check("x", "t", ok)) for ok in (True, False, None)] == ["PASS", "FAIL", "SKIP"]


def test_table_has_header_jobs_and_every_check():
    text = render_table(report())
    lines = text.splitlines()
    assert lines[0] == "rehearsal of flagship: 80 nodes, 640 GPUs, 7 jobs, 52 s"
    for job in JOBS:
        row = next(ln for ln in lines if job["model"] in ln)
        assert job["job_id"] in row and "RUNNING" in row and "11" in row
    for name in NAMES:
        row = next((ln for ln in lines if f" {name} " in f" {ln} "), None)
        assert row is not None and row.split()[0] == "PASS" and f"what {name} asserts" in row, name
    assert "FAIL" not in text and "SKIP" not in text


def test_table_shows_failures_with_indented_details_and_fits_120_columns():
    long = "gpu-queue-st-p5e-48xlarge-[1-80] (80 nodes): OnNodeStart script compute-node.sh exited 1: " + "x " * 60
    text = render_table(report(failed={"booted": [long, "head: no boot result"], "paths": ["model-1: /fsx/a"]}))
    lines = text.splitlines()
    assert max(len(ln) for ln in lines) <= WIDTH
    booted = next(i for i, ln in enumerate(lines) if ln.split()[:2] == ["FAIL", "booted"])
    assert "gpu-queue-st-p5e-48xlarge-[1-80] (80 nodes)" in lines[booted + 1]
    detail_col = lines[booted].index("what booted")
    assert lines[booted + 1].index("gpu-queue") > detail_col          # indented under the title
    assert any("head: no boot result" in ln for ln in lines[booted + 1:booted + 6])
    assert any(ln.split()[:2] == ["FAIL", "paths"] for ln in lines)
    assert any(ln.split()[:2] == ["PASS", "secrets"] for ln in lines)


def test_check_names_never_wrap_in_a_narrow_title_column():
    checks = report(failed={"gpus_unshared": ["a " * 200]})
    for c in checks.checks:
        c.title = "t " * 80
    lines = render_table(checks).splitlines()
    assert max(len(ln) for ln in lines) <= WIDTH
    assert sum(1 for ln in lines if "gpus_unshared" in ln) == 1
    assert any(ln.split()[:2] == ["FAIL", "gpus_unshared"] for ln in lines)


def test_skipped_checks_and_placed_nodes():
    jobs = [{"model": "model-0", "job_id": None, "planned_nodes": 11, "nodes": [], "state": None, "reason": None},
            {"model": "model-1", "job_id": "7", "planned_nodes": 11, "nodes": 9, "state": "PENDING",
             "reason": "Resources"}]
    rep = report(failed={"booted": ["x"]}, skipped=set(NAMES[1:9]), jobs=jobs)
    lines = render_table(rep).splitlines()
    assert sum(1 for ln in lines if ln.split()[:1] == ["SKIP"]) == 8
    row = next(ln for ln in lines if "model-1" in ln)
    assert row.split()[:5] == ["model-1", "7", "11", "9", "PENDING"] and "Resources" in row
    assert "gpu-queue-st-p5e-48xlarge-[1-11]" in render_table(report())


def test_kept_directory_in_header():
    rep = report()
    rep.kept = "/tmp/rehearsal-x"
    assert render_table(rep).splitlines()[0].endswith("; kept running in /tmp/rehearsal-x")


def test_summary_line_passed():
    assert summary_line(report()) == "rehearsal passed: 10 checks, 7 jobs on 80 nodes (640 GPUs) in 52 s"


def test_summary_line_failed_names_the_checks():
    assert summary_line(report(failed={"booted": ["x"], "paths": ["y"]})) == \
        "rehearsal failed: booted, paths (2 of 10 checks)"
    assert summary_line(report(failed={"booted": ["x"]}, skipped=set(NAMES[1:9]))) == \
        "rehearsal failed: booted (1 of 10 checks, 8 not run)"
    assert summary_line(report(skipped={"world"})) == "rehearsal failed: 1 of 10 checks did not run (world)"
