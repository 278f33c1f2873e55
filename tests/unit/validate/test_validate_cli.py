"""CLI exit codes and one-line errors (typer CliRunner)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from clustertrain.cli.validate import app

FIX = Path(__file__).parent / "fixtures"
runner = CliRunner()


def test_parse_ok_and_failed_exit_codes():
    ok = runner.invoke(app, ["parse", str(FIX / "nccl-six-ops-loop-2rank.txt")])
    assert ok.exit_code == 0 and "verdict: OK" in ok.output
    bad = runner.invoke(app, ["parse", str(FIX / "nccl-all_reduce-wrong-results.txt"), "--json"])
    assert bad.exit_code == 1 and '"failed": true' in bad.output


def test_parse_unknown_file_is_one_line_exit_2(tmp_path):
    f = tmp_path / "x.log"
    f.write_text("nothing useful\n")
    res = runner.invoke(app, ["parse", str(f)])
    assert res.exit_code == 2 and "cannot tell which tool" in res.output and "Traceback" not in res.output


def test_scan_json_and_exit_code():
    res = runner.invoke(app, ["scan", "--role", "container", "--json"])
    assert res.exit_code in (0, 1) and '"role": "container"' in res.output
    bad = runner.invoke(app, ["scan", "--role", "login"])
    assert bad.exit_code == 2 and "valid roles" in bad.output


def test_collectives_bad_size_and_op():
    res = runner.invoke(app, ["collectives", "--max-bytes", "huge"])
    assert res.exit_code == 2 and "4G" in res.output
    res = runner.invoke(app, ["collectives", "--ops", "allreduce"])
    assert res.exit_code == 2 and "valid ops are" in res.output


def test_storage_python_engine(tmp_path):
    res = runner.invoke(app, ["storage", str(tmp_path), "--size", "2M", "--files", "20", "--engine", "python"])
    assert res.exit_code == 0 and "verdict: OK" in res.output
    res = runner.invoke(app, ["storage", str(tmp_path), "--size", "2M", "--files", "20", "--cache", "none"])
    assert res.exit_code == 2 and "'none' is not one of 'auto', 'direct', 'drop', 'buffered'" in res.output
    res = runner.invoke(app, ["storage", str(tmp_path), "--size", "2M", "--files", "20", "--json"])
    assert res.exit_code == 0 and '"cache_bypass": "direct"' in res.output


def test_parse_expect_efa_fails_a_socket_fallback_and_an_old_plugin():
    sock = runner.invoke(app, ["parse", str(FIX / "nccl-all_gather-socket-fallback.txt")])
    assert sock.exit_code == 0  # without --expect-efa a socket run is only a warning
    sock = runner.invoke(app, ["parse", str(FIX / "nccl-all_gather-socket-fallback.txt"), "--expect-efa"])
    assert sock.exit_code == 1 and "problem: transport: Socket on 1/1 process(es); NCCL fell back to TCP" in sock.output
    efa = FIX / "nccl-all_reduce-16rank-efa-srun-prefix.txt"  # aws-ofi-nccl 1.8.1-aws
    assert runner.invoke(app, ["parse", str(efa), "--expect-efa", "--instance-type", "p5.48xlarge"]).exit_code == 0
    old = runner.invoke(app, ["parse", str(efa), "--expect-efa", "--instance-type", "p5e.48xlarge"])
    assert old.exit_code == 1 and "1.8.1-aws is older than 1.11.0" in old.output
