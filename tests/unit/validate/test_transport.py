"""Which network NCCL used, and the suite's transport verdict (issue 12, item 10b): an EFA cluster whose
collectives go over NET/Socket must FAIL, and so must a p5e cluster whose aws-ofi-nccl predates p5e.

The NCCL logs are the project's own fixtures (tests/unit/validate/fixtures/nccl-debug-rank-*.log), written
from the documented NCCL / aws-ofi-nccl message formats; none is copied from a third-party publication."""

from __future__ import annotations

import json
from pathlib import Path

from clustertrain.resolve import load_project
from clustertrain.validate import CollectiveRun, parse_output_file
from clustertrain.validate.suite import JobOutcome, SuiteConfig, SuitePaths, gather, plan_suite, suite_context
from clustertrain.validate.transport import (detect_transport, gdrcopy_row, gdrcopy_state, nccl_processes, one_rank_rows,
                                             transport_rows)

FIXTURES = Path(__file__).parent / "fixtures"
EXAMPLE_P5E = Path(__file__).parents[3] / "examples" / "p5e-80x7.yaml"
EFA_LOG = (FIXTURES / "nccl-debug-rank-efa-p5e.log").read_text()
SOCKET_LOG = (FIXTURES / "nccl-debug-rank-socket-fallback.log").read_text()


def efa_logs(n: int, version: str = "1.14.2") -> list[str]:
    """n processes of the EFA fixture (distinct pids, two hosts), with the plugin version replaced."""
    return [EFA_LOG.replace(":21344:", f":{21344 + i}:").replace("p5e-1:", f"p5e-{1 + i // 8}:")
            .replace("aws-ofi-nccl 1.14.2", f"aws-ofi-nccl {version}") for i in range(n)]


def p5e(**kw) -> list:
    return transport_rows(kw.pop("logs"), backend="nccl", efa_expected=True, instance_type="p5e.48xlarge", **kw)


def test_processes_are_read_from_the_nccl_log_formats():
    [proc] = nccl_processes(EFA_LOG)
    assert (proc.host, proc.pid, proc.network, proc.provider, proc.plugin_version) == \
        ("gpu-queue-st-p5e-1", "21344", "Libfabric", "efa", "1.14.2")
    assert proc.transport == "EFA"
    [sock] = nccl_processes(SOCKET_LOG)
    assert (sock.network, sock.transport, sock.plugin_version) == ("Socket", "Socket", None)
    assert detect_transport(SOCKET_LOG)["socket_fallback"] and detect_transport(EFA_LOG)["transport"] == "EFA"
    # processes interleaved in one stream (an nccl-tests log): the worst one is reported
    assert detect_transport(EFA_LOG + SOCKET_LOG)["transport"] == "Socket"


def test_transport_in_our_nccl_tests_fixtures():
    efa = parse_output_file(FIXTURES / "nccl-all_reduce-16rank-efa-srun-prefix.txt")
    sock = parse_output_file(FIXTURES / "nccl-all_gather-socket-fallback.txt")
    assert (efa.transport, efa.ofi_nccl_version) == ("EFA", "1.8.1-aws")
    assert sock.transport == "Socket" and any("EFA/aws-ofi-nccl was not used" in w for w in sock.warnings)


def test_efa_everywhere_passes_with_the_plugin_version():
    rows = p5e(logs=efa_logs(16))
    assert [(r.check, r.verdict) for r in rows] == [("transport", "pass"), ("aws-ofi-nccl (NCCL log)", "pass")]
    assert rows[0].found == "EFA (Libfabric, provider efa) on 16/16 process(es)"
    assert rows[1].found == "1.14.2" and rows[1].threshold == ">= 1.11.0 (p5e.48xlarge)"


def test_socket_fallback_on_an_efa_cluster_fails_with_one_line():
    rows = p5e(logs=efa_logs(15) + [SOCKET_LOG])
    assert rows[0].verdict == "fail" and rows[0].found == "Socket on 1/16 process(es)"
    assert rows[0].detail.startswith("NCCL fell back to TCP sockets (NET/Socket) on gpu-queue-st-p5e-2: EFA is not used")
    assert "\n" not in rows[0].detail
    [only] = p5e(logs=[SOCKET_LOG])  # every process on sockets: no plugin row to add
    assert (only.verdict, only.found) == ("fail", "Socket on 1/1 process(es)")


def test_libfabric_over_tcp_is_not_efa():
    tcp = EFA_LOG.replace("Selected provider is efa, fabric is efa-direct", "Selected provider is tcp, fabric is 10.0.64.0/18")
    [row, _] = p5e(logs=[tcp])
    assert (row.verdict, row.found) == ("fail", "OFI (tcp) on 1/1 process(es)")


def test_plugin_older_than_p5e_support_fails_on_p5e_only():
    rows = p5e(logs=efa_logs(2, "1.10.0-aws"))
    assert [r.verdict for r in rows] == ["pass", "fail"]
    assert "1.10.0-aws is older than 1.11.0" in rows[1].detail and "eb584463" in rows[1].detail
    p5 = transport_rows(efa_logs(2, "1.10.0-aws"), backend="nccl", efa_expected=True, instance_type="p5.48xlarge")
    assert [r.verdict for r in p5] == ["pass", "pass"] and p5[1].threshold == ">= 1.8.1 (p5.48xlarge)"


def test_missing_log_fails_and_gloo_is_not_applicable():
    [row] = p5e(logs=[])
    assert (row.verdict, row.found) == ("fail", "not logged")
    [gloo] = transport_rows([], backend="gloo", efa_expected=False, instance_type=None)
    assert (gloo.check, gloo.verdict) == ("transport", "not-applicable")
    [plain] = transport_rows([SOCKET_LOG], backend="nccl", efa_expected=False, instance_type="g5.12xlarge")
    assert (plain.verdict, plain.found) == ("pass", "Socket on 1 process(es)")  # no EFA on that type


def test_suite_reads_the_nccl_logs_its_collectives_job_leaves(tmp_path):
    """The suite end to end on recorded files: plan (NCCL debug env), then gather the results directory."""
    project = load_project(EXAMPLE_P5E)
    paths = SuitePaths(tmp_path / "suite")
    jobs, _ = plan_suite(project, SuiteConfig(nodes=2), paths)
    [coll] = [j for j in jobs if j.name == "collectives"]
    assert coll.env.set["NCCL_DEBUG"] == "INFO" and coll.env.set["NCCL_DEBUG_FILE"] == "nccl-%h-%p.log"
    coll.results_dir.mkdir(parents=True)
    run = parse_output_file(FIXTURES / "nccl-all_reduce-16rank-efa-srun-prefix.txt")
    run = CollectiveRun.model_validate({**json.loads(run.model_dump_json()), "tool": "clustertrain", "backend": "nccl"})
    coll.outputs[0].write_text(run.model_dump_json())
    for i, text in enumerate(efa_logs(15) + [SOCKET_LOG]):
        (coll.results_dir / f"nccl-host-{i}.log").write_text(text)
    outcome = JobOutcome(name="collectives", job_id="7", state="COMPLETED", exit_code=0)
    ctx = suite_context(project, SuiteConfig(nodes=2), paths)
    assert ctx.key == "p5e"
    rows = {r.check: r for r in gather(coll, outcome, [], ctx)}
    assert rows["transport"].verdict == "fail" and rows["transport"].found == "Socket on 1/16 process(es)"
    assert rows["all_reduce busbw"].verdict == "pass"  # bandwidth alone would have passed this cluster
    (coll.results_dir / "nccl-host-15.log").write_text(efa_logs(16)[15])
    rows = {r.check: r for r in gather(coll, outcome, [], ctx)}
    assert rows["transport"].verdict == "pass"


# -- a one-rank init inside the image (`clustertrain image check`) ----------------------------------------------

H200_NO_EFA = (FIXTURES / "nccl-init-1rank-h200-no-efa.log").read_text()  # REAL: recorded on a lent H200, no EFA
ONE_RANK_EFA = (FIXTURES / "nccl-init-1rank-efa-p5e.log").read_text()      # written from the documented formats


def test_the_real_h200_recording_is_diagnosed_as_the_socket_fallback_with_no_plugin_found():
    assert detect_transport(H200_NO_EFA)["transport"] == "Socket"
    rows = {r.check: r for r in one_rank_rows(H200_NO_EFA, efa_expected=True, instance_type="p5e.48xlarge")}
    assert list(rows) == ["transport", "gdrcopy"]  # Socket: no aws-ofi-nccl version row
    t = rows["transport"]
    assert (t.verdict, t.found) == ("fail", "Socket on 1/1 process(es)")
    assert t.detail.startswith("NCCL fell back to TCP sockets (NET/Socket) on vm: EFA is not used")
    assert "'Using network Socket' after 'NET/Plugin: Could not find: libnccl-net.so'" in t.detail
    g = rows["gdrcopy"]
    assert (g.verdict, g.found) == ("fail", "not logged") and "FI_LOG_LEVEL=info" in g.detail


def test_a_one_rank_init_over_efa_with_gdrcopy_passes():
    rows = one_rank_rows(ONE_RANK_EFA, efa_expected=True, instance_type="p5e.48xlarge")
    assert [(r.check, r.verdict) for r in rows] == [("transport", "pass"), ("aws-ofi-nccl (NCCL log)", "pass"),
                                                   ("gdrcopy", "pass")]
    assert rows[1].found == "1.22.0"
    assert rows[2].found == "in use (Loaded GDRCopy library: /opt/gdrcopy/lib/libgdrapi.so.2.5)"


def test_gdrcopy_failures_win_over_success_and_name_the_cause():
    assert gdrcopy_state(ONE_RANK_EFA) == ("in use", "Loaded GDRCopy library: /opt/gdrcopy/lib/libgdrapi.so.2.5")
    no_lib = ONE_RANK_EFA.replace("Loaded GDRCopy library: /opt/gdrcopy/lib/libgdrapi.so.2.5",
                                  "Failed to find usable libgdrapi.so")
    row = gdrcopy_row([no_lib], efa_expected=True)
    assert (row.verdict, row.found) == ("fail", "not loaded (Failed to find usable libgdrapi.so)")
    assert "/opt/gdrcopy/lib" in row.detail
    no_driver = ONE_RANK_EFA + ("libfabric:4242:1764201600::core:core:cuda_gdrcopy_hmem_init():183<warn> "
                                "gdr_open failed!\n")
    row = gdrcopy_row([no_driver], efa_expected=True)
    assert (row.verdict, row.found) == ("fail", "driver missing (gdr_open failed!)") and "gdrdrv" in row.detail
    assert gdrcopy_row([H200_NO_EFA], efa_expected=False).verdict == "not-applicable"


def test_without_efa_on_the_instance_type_any_network_passes_the_one_rank_check():
    rows = one_rank_rows(H200_NO_EFA, efa_expected=False, instance_type="g5.12xlarge")
    assert [(r.check, r.verdict) for r in rows] == [("transport", "pass"), ("gdrcopy", "not-applicable")]
