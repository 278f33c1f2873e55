"""The CLI's one error path, typer-checked choices, `config schema`, the submit header, and a light start-up."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import typer
import yaml
from typer.testing import CliRunner

from clustertrain.cli import app as root_app
from clustertrain.cli import config as config_cli
from clustertrain.cli import main
from clustertrain.cli.common import CommandGroup
from clustertrain.cli.jobs import submit_command_line
from clustertrain.core.errors import ConfigError
from clustertrain.project import validate_project

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
QUICKSTART = EXAMPLES / "quickstart.yaml"
HEAVY = ("torch", "numpy", "boto3", "botocore", "tokenizers", "pcluster")


def run_main(argv: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as done:
        main(argv)
    out, err = capsys.readouterr()
    return done.value.code, out, err


# -- one error path -----------------------------------------------------------------------------------

def test_a_user_mistake_through_main_is_one_error_line_and_exit_2(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("CLUSTERTRAIN_DEBUG", raising=False)
    code, out, err = run_main(["config", "show", str(tmp_path / "nope.yaml")], capsys)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1 and "project file not found" in err


def test_a_user_mistake_in_a_sub_app_run_on_its_own_is_the_same_line(tmp_path, monkeypatch):
    monkeypatch.delenv("CLUSTERTRAIN_DEBUG", raising=False)
    bad = tmp_path / "p.yaml"
    bad.write_text("name: x\nmodels:\n- {name: a, model: {layers: 2, hidden: 64, heads: 5, seq_len: 32}, training: {max_steps: 1}}\n")
    res = CliRunner().invoke(config_cli.app, ["show", str(bad)])
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit)
    assert res.output.startswith(f"error: {bad}:3: models[0].model: ") and res.output.count("\n") == 1
    assert "heads (5) must divide hidden (64)" in res.output and "Traceback" not in res.output


def test_debug_shows_the_traceback_after_the_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTERTRAIN_DEBUG", "1")
    code, _, err = run_main(["config", "show", str(tmp_path / "nope.yaml")], capsys)
    assert code == 2 and err.startswith("error: ") and "Traceback (most recent call last)" in err and "ConfigError" in err


def test_a_bad_option_is_clicks_usage_error(capsys):
    code, out, err = run_main(["plan", str(QUICKSTART), "--no-such-option"], capsys)
    assert code == 2 and out == ""
    assert "Usage: clustertrain plan" in err and "No such option: --no-such-option" in err


def test_typer_rejects_a_bad_choice_before_the_command_runs(capsys):
    code, out, err = run_main(["plan", str(QUICKSTART), "--format", "xml"], capsys)
    assert code == 2 and out == ""   # nothing planned
    assert "Invalid value for '--format'" in err and "'xml'" in err and "'markdown'" in err
    code, out, _ = run_main(["plan", str(QUICKSTART), "--format", "json"], capsys)
    assert code == 0 and json.loads(out)["feasible"] is True


def test_every_app_has_the_one_error_path():
    """A sub-app made without :func:`clustertrain.cli.common.command_group` would print tracebacks when run alone."""
    import importlib

    assert isinstance(typer.main.get_command(root_app), CommandGroup)
    modules = ("config", "data", "cluster", "storage", "local_slurm", "validate")
    plain = [m for m in modules
             if not isinstance(typer.main.get_command(importlib.import_module(f"clustertrain.cli.{m}").app), CommandGroup)]
    assert plain == []


# -- config schema -------------------------------------------------------------------------------------

def test_config_schema_is_a_json_schema_that_accepts_the_examples_and_refuses_typos(capsys, tmp_path):
    code, out, _ = run_main(["config", "schema"], capsys)
    assert code == 0
    schema = json.loads(out)
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for example in ("quickstart.yaml", "p5e-80x7.yaml", "model7-twin.yaml", "p5-30b.yaml", "p5-30b-twin.yaml",
                    "continue-smollm2.yaml"):
        errors = [e.message for e in validator.iter_errors(yaml.safe_load((EXAMPLES / example).read_text()))]
        assert errors == [], (example, errors)
    assert not validator.is_valid(yaml.safe_load((EXAMPLES / "seed-003-cluster.yaml").read_text()))  # not a project
    typo = yaml.safe_load(QUICKSTART.read_text())
    typo["models"][0]["training"]["max_step"] = 5
    assert any("max_step" in e.message for e in validator.iter_errors(typo))
    lr = schema["$defs"]["TrainingConfig"]["properties"]["lr"]
    assert lr["description"] == "Peak learning rate." and lr["exclusiveMinimum"] == 0
    written = tmp_path / "schema dir" / "project.schema.json"
    written.parent.mkdir()
    code, out, _ = run_main(["config", "schema", "-o", str(written)], capsys)
    assert code == 0 and out == "" and json.loads(written.read_text()) == schema
    assert [p.name for p in written.parent.iterdir()] == ["project.schema.json"]  # no temp file left


def test_config_schema_takes_the_shape_from_a_preset_or_from_the_fields_as_loading_does(capsys):
    """`preset:` supplies layers, hidden, heads and seq_len: the schema must not ask for them then, and must still
    ask for them (all four) without a preset, so an editor agrees with `clustertrain check`."""
    code, out, _ = run_main(["config", "schema"], capsys)
    assert code == 0
    validator = jsonschema.Draft202012Validator(json.loads(out))

    def project(model: dict) -> dict:
        return {"name": "p", "cluster": {"backend": "local"}, "storage": {"root": "/tmp/p"},
                "models": [{"name": "a", "model": model, "training": {"max_steps": 5}}]}

    def loads(model: dict) -> bool:
        try:
            validate_project(project(model))
        except ConfigError:
            return False
        return True

    shape = {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 64}
    cases = [({"preset": "smollm2-135m"}, True), ({"preset": "llama3-8b", "layers": 40}, True), (shape, True),
             ({}, False), ({"vocab": 32000}, False), ({k: v for k, v in shape.items() if k != "seq_len"}, False),
             ({"preset": None, "hidden": 64}, False), ({"preset": "smollm2-135m", "layer": 2}, False)]
    for model, valid in cases:
        errors = list(validator.iter_errors(project(model)))
        assert (errors == []) is valid, (model, [e.message for e in errors])
        assert loads(model) is valid, model   # the schema says what loading does


# -- submit header -------------------------------------------------------------------------------------

def test_submit_header_is_built_from_the_parsed_options_not_sys_argv(capsys, tmp_path, monkeypatch):
    where = tmp_path / "a 'dir'"
    where.mkdir()
    path = where / "p.yaml"
    path.write_text(
        "name: hdr\ncluster: {backend: slurm, nodes: 1, procs_per_node: 1}\n"
        f"storage: {{root: {str(tmp_path / 'fsx')!r}}}\n"
        "models:\n- {name: a, model: {layers: 2, hidden: 64, heads: 4, seq_len: 64}, training: {max_steps: 5}}\n")
    monkeypatch.setattr(sys, "argv", ["pytest", "-q", "--junk"])  # what the old header copied
    args = ["submit", str(path), "--set", "models.a.training.max_steps=7", "--dry-run", "--model", "a", "--no-resume"]
    code, out, _ = run_main(args, capsys)
    assert code == 0, out
    header = next(line for line in out.splitlines() if "Submitted with:" in line)
    command = header.split("Submitted with: ", 1)[1]
    assert shlex.split(command) == ["clustertrain", "submit", str(path), "--model", "a",
                                    "--set", "models.a.training.max_steps=7", "--no-resume"]
    assert "--dry-run" not in command and "--junk" not in command
    assert submit_command_line(Path("p.yaml"), None, None, [], False) == "clustertrain submit p.yaml"


# -- start-up ------------------------------------------------------------------------------------------

def test_help_and_config_schema_import_no_heavy_library():
    probe = ("import contextlib, io, json, sys\n"
             "from clustertrain.cli import main\n"
             "loaded = {}\n"
             "for argv in (['--help'], ['config', 'schema'], ['config', 'show', 'examples/quickstart.yaml']):\n"
             "    with contextlib.redirect_stdout(io.StringIO()):\n"
             "        try:\n            main(argv)\n"
             "        except SystemExit as e:\n            assert e.code == 0, (argv, e.code)\n"
             f"    loaded[' '.join(argv)] = [m for m in {HEAVY!r} if m in sys.modules]\n"
             "print(json.dumps(loaded))\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert loaded == {"--help": [], "config schema": [], "config show examples/quickstart.yaml": []}
