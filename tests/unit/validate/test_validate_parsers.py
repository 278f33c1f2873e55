"""Parsers on captured-format text written by us (see fixtures/README.md) and on real fio JSON captured here."""

from __future__ import annotations

from pathlib import Path

import pytest

from clustertrain.validate import (
    ValidateError, bus_factor, detect_tool, detect_transport, parse_fi_info, parse_nccl_tests, parse_nvidia_smi_csv,
    parse_output, parse_size, parse_version, version_at_least,
)

FIX = Path(__file__).parent / "fixtures"


def text(name: str) -> str:
    return (FIX / name).read_text()


def test_modern_srun_prefix_efa_with_info_lines_inside_table():
    run = parse_output(text("nccl-all_reduce-16rank-efa-srun-prefix.txt"))
    assert run.tool == "nccl-tests" and not run.failed, run.problems
    assert run.transport == "EFA" and run.nccl_version == "2.18.5+cuda12.2" and run.ofi_nccl_version == "1.8.1-aws"
    assert run.world_size == 16 and run.hosts == ["p5-st1-1", "p5-st1-2"]
    rep = run.reports[0]
    assert rep.op == "all_reduce" and rep.complete and len(rep.rows) == 10
    assert rep.rows[0].size_bytes == 8 and rep.rows[-1].size_bytes == 8 << 27
    for r in rep.rows:  # busbw = algbw * 2(n-1)/n within print rounding
        if r.algbw_gbps > 1:
            assert r.busbw_gbps == pytest.approx(r.algbw_gbps * 30 / 16, rel=0.01)
    assert rep.avg_busbw_gbps == pytest.approx(sum(r.busbw_gbps for r in rep.rows) / 10, rel=0.01)


def test_six_binaries_in_one_log_each_become_a_report():
    run = parse_output(text("nccl-six-ops-loop-2rank.txt"))
    assert [r.op for r in run.reports] == ["all_reduce", "all_gather", "broadcast", "reduce", "reduce_scatter", "alltoall"]
    assert not run.failed and all(len(r.rows) == 9 and r.complete for r in run.reports)
    a2a = run.reports[-1]
    assert all(r.inplace_wrong is None and r.wrong == 0 for r in a2a.rows)  # N/A = not checked, not a failure
    bc = run.reports[2]
    assert bc.rows[0].root == 0 and bc.rows[0].redop == "none"


def test_legacy_alltoall_blank_redop_tag_output_and_stderr_ignored():
    run = parse_nccl_tests(text("nccl-alltoall-legacy-8rank-mpirun-tag.txt"))
    rep = run.reports[0]
    assert rep.op == "alltoall" and rep.nranks == 8 and len(rep.rows) == 9 and not run.failed
    assert rep.rows[0].redop == "" and rep.rows[0].wrong is None  # legacy error column N/A
    assert any("inferred" in n for n in rep.notes)


def test_wrong_results_and_out_of_bounds_fail():
    run = parse_output(text("nccl-all_reduce-wrong-results.txt"))
    assert run.failed
    bad = [r for r in run.reports[0].rows if r.wrong]
    assert [(r.size_bytes, r.wrong, r.inplace_wrong) for r in bad] == [(32768, 48, 16)]
    assert run.reports[0].out_of_bounds == 2
    assert any("#wrong 48" in p for p in run.problems) and any("Out of bounds" in p for p in run.problems)


def test_truncated_run_partial_row_is_not_a_result():
    run = parse_output(text("nccl-reduce_scatter-truncated-timelimit.txt"))
    rep = run.reports[0]
    assert run.failed and not rep.complete and len(rep.rows) == 6
    assert any("TIME LIMIT" in p for p in run.problems) and any("trailer" in p for p in run.problems)
    assert any("cut-off row" in n for n in rep.notes)


def test_startup_failure_has_no_rows_and_fails():
    run = parse_output(text("nccl-broadcast-startup-failure.txt"))
    assert run.failed and run.reports[0].rows == [] and run.reports[0].op == "broadcast"
    assert any("unhandled system error" in p for p in run.problems)


def test_socket_fallback_is_flagged():
    run = parse_output(text("nccl-all_gather-socket-fallback.txt"))
    assert run.transport == "Socket" and not run.failed
    assert any("Socket" in w for w in run.warnings)
    assert run.reports[0].op == "all_gather" and len(run.reports[0].rows) == 10


def test_transport_detection_variants():
    assert detect_transport("x NCCL INFO NET/OFI Selected Provider is efa\nx NCCL INFO Using network AWS Libfabric")["transport"] == "EFA"
    assert detect_transport("NCCL INFO NET/OFI Selected provider is cxi\nNCCL INFO Using network Libfabric")["transport"] == "OFI (cxi)"
    assert detect_transport("NCCL INFO Using network IB")["transport"] == "IB"
    t = detect_transport("NCCL INFO Using network Socket")
    assert t["transport"] == "Socket" and t["socket_fallback"]
    assert detect_transport("no debug here")["transport"] is None


def test_avg_check_bound_failed_and_column_overflow():
    # written by us from nccl-tests src/common.cu: '-c' check bound prints 'FAILED' after the avg; 1-rank
    # in-place columns can overflow their width, so rows are split on whitespace
    log = """# nThread 1 nGpus 1 minBytes 8 maxBytes 16 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#  Rank  0 Group  0 Pid    1 on h device  0 [0000:01:00] GPU
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
           8             2     float     sum       0     4.21    0.00    0.00      0     0.19   5706839.35  5706839.35  0
          16             4     float     sum       0     4.00    0.00    0.00      0     0.19    0.08       0.08        0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 202818 FAILED
"""
    run = parse_nccl_tests(log)
    rep = run.reports[0]
    assert len(rep.rows) == 2 and rep.rows[0].inplace_busbw_gbps == pytest.approx(5706839.35)
    assert run.failed and any("check bound" in p for p in rep.problems)
    assert any("implausible" in n for n in rep.notes)


def test_unknown_text_is_a_clear_error():
    with pytest.raises(ValidateError, match="cannot tell which tool"):
        parse_output("hello\nworld\n")


def test_fio_captured_json_with_leading_comment():
    run = parse_output(text("fio-3.33-seqwrite-captured.json.txt"))
    assert run.tool == "fio" and not run.failed
    r = run.results[0]
    assert r.target == "seqwrite" and r.write_mib_s and r.write_mib_s > 0 and r.read_mib_s is None
    assert r.ops["write"]["io_bytes"] == 32 * 1024 * 1024


def test_fio_two_jobs_same_name_are_summed():
    import json

    raw = text("fio-3.33-seqread-2jobs-captured.json.txt")
    jobs = json.loads(raw.split("\n", 1)[1])["jobs"]
    run = parse_output(raw)
    assert len(run.results) == 1 and run.results[0].tasks == 2
    assert run.results[0].read_mib_s == pytest.approx(sum(j["read"]["bw_bytes"] for j in jobs) / 2**20)


def test_ior_verbose_summary_by_header_name():
    run = parse_output(text("ior-4.0-verbose-sample.txt"))
    r = run.results[0]
    assert run.tool == "ior" and not run.failed
    assert (r.write_mib_s, r.read_mib_s, r.tasks) == (2000.0, 4400.0, 16)
    assert r.ops["write"]["max"] == 2200.0 and r.ops["read"]["min"] == 4200.0


def test_ior_old_summary_and_error_run():
    r = parse_output(text("ior-3x-old-summary-sample.txt")).results[0]
    assert (r.write_mib_s, r.read_mib_s, r.tasks) == (900.5, 1110.25, 64)
    bad = parse_output(text("ior-error-no-summary-sample.txt"))
    assert bad.failed and any("ior ERROR" in p for p in bad.problems)


def test_mdtest_colon_format_ignores_time_table():
    run = parse_output(text("mdtest-colon-and-time-table-sample.txt"))
    r = run.results[0]
    assert run.tool == "mdtest" and r.tasks == 16
    assert (r.create_per_s, r.stat_per_s, r.unlink_per_s) == (14000.0, 90000.0, 10000.0)
    assert r.ops["directory creation"]["max"] == 12000.0  # the rate table, not the time table (1.600)
    assert len(r.ops) == 9


def test_detect_tool():
    assert detect_tool(text("mdtest-colon-and-time-table-sample.txt")) == "mdtest"
    assert detect_tool(text("ior-3x-old-summary-sample.txt")) == "ior"
    assert detect_tool(text("nccl-broadcast-startup-failure.txt")) == "nccl-tests"


def test_nvidia_smi_csv():
    rows = parse_nvidia_smi_csv(text("nvidia-smi-query-gpu-8xh100-sample.csv").split("\n", 1)[1])
    assert len(rows) == 8 and rows[0]["name"] == "NVIDIA H100 80GB HBM3"
    assert rows[0]["memory.total"] == "81559 MiB" and rows[7]["pci.bus_id"] == "00000000:CA:00.0"
    assert rows[5]["ecc.errors.uncorrected.volatile.total"] is None and rows[0]["driver_version"] == "535.183.01"


def test_fi_info_blocks():
    blocks = parse_fi_info(text("fi_info-efa-rdm-mpirun-sample.txt"))
    assert [b["provider"] for b in blocks] == ["efa", "efa", "shm"]
    assert blocks[1]["domain"] == "rdmap80s0-rdm" and blocks[0]["protocol"] == "FI_PROTO_EFA"


def test_versions_sizes_factors():
    assert parse_version("v1.8.1-aws") == (1, 8, 1) and parse_version("2.18.5-1+cuda12.2") == (2, 18, 5)
    assert version_at_least("535.54.03", "535.54.03") and not version_at_least("535.54.02", "535.54.03")
    assert version_at_least("570.133.20", "535.54.03") and version_at_least("12.2", "12.2.0")
    assert version_at_least("unknown", "1.0") is None
    assert [parse_size(s) for s in ("8", "1K", "4M", "4G", "4GiB")] == [8, 1024, 4 << 20, 4 << 30, 4 << 30]
    with pytest.raises(ValidateError, match="4G"):
        parse_size("lots")
    assert bus_factor("all_reduce", 16) == pytest.approx(30 / 16)
    assert bus_factor("alltoall", 8) == pytest.approx(7 / 8) and bus_factor("broadcast", 8) == 1.0
