"""Every mistake of a project file named, the cause first (issue 36, item 5): the lines each command prints are golden
files under ``golden/`` (``CLUSTERTRAIN_UPDATE_GOLDEN=1`` rewrites them; review the diff).

* a typo (``max_step:``) is an unknown key with its closest valid key, and the "required key is missing" it causes
  is not reported;
* several mistakes print one ``error:`` line each — unknown keys, then the other fields, then cross-field checks —
  from every command that loads the file;
* ``run`` names the project field of a data source that names no file (as ``check`` does), not ``--input``;
* ``plan`` names only settings that make a model fit, and exits 2 on an infeasible plan, as ``check`` does;
* ``CLUSTERTRAIN_DEBUG`` shows tracebacks for ``1``/``true``/``yes`` only.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError
from typer.testing import CliRunner

from clustertrain.cli import app
from clustertrain.core.errors import ConfigError, DataError
from clustertrain.core.schema import StrictModel, load_yaml_model, ordered_errors
from clustertrain.launch.prepare import check_source_files
from clustertrain.resolve import load_project
from tests.support.golden import check_golden

GOLDEN = Path(__file__).parent / "golden"
ROOT = Path(__file__).resolve().parents[2]
P5E = ROOT / "examples" / "p5e-80x7.yaml"

BASE = """name: corpus
cluster: {backend: local, gpus_per_node: 0, procs_per_node: 2}
storage: {root: runs}
models:
  - name: tiny
    model: {layers: 2, hidden: 64, heads: 4, seq_len: 32}
    data: {source: "builtin:shakespeare", tokenizer: byte}
    training:
      max_steps: 1
      micro_batch: 1
      global_batch: 2
"""


def edit(text: str, *changes: tuple[str, str]) -> str:
    for old, new in changes:
        assert old in text, old
        text = text.replace(old, new, 1)
    return text


TYPO = edit(BASE, ("max_steps: 1", "max_step: 1"))
TWO_TYPOS = edit(TYPO, ("hidden: 64", "hiddn: 64"))
#: a typo (line 9), a bad value (line 2) and a cross-field check of a second model (line 13): printed in that order
THREE = edit(TYPO, ("backend: local", "backend: k8s")) + """  - name: small
    model: {layers: 2, hidden: 64, heads: 5, seq_len: 32}
    training: {max_steps: 1, micro_batch: 1, global_batch: 2}
"""
LOADERS = (("check", "p.yaml"), ("config", "show", "p.yaml"), ("run", "p.yaml"), ("plan", "p.yaml"))


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))}


def refused(tmp_path: Path, monkeypatch, text: str, argv: tuple[str, ...]) -> str:
    """Run ``clustertrain argv`` on ``text`` as ``p.yaml`` in ``tmp_path``: it must exit 2 with only ``error:`` lines
    on stderr, nothing on stdout, no traceback and nothing written; return stderr (the temporary directory as
    ``<tmp>``)."""
    monkeypatch.delenv("CLUSTERTRAIN_DEBUG", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.yaml").write_text(text)
    before = snapshot(tmp_path)
    result = CliRunner().invoke(app, list(argv), prog_name="clustertrain")
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert result.stdout == "" and "Traceback" not in result.stderr, result.output
    assert result.stderr and all(line.startswith("error: ") for line in result.stderr.splitlines()), result.stderr
    assert snapshot(tmp_path) == before
    return result.stderr.replace(str(tmp_path.resolve()), "<tmp>").replace(str(tmp_path), "<tmp>")


@pytest.mark.parametrize("argv", LOADERS, ids=lambda a: " ".join(a[:-1]))
@pytest.mark.parametrize("name, text, lines", [("typo", TYPO, 1), ("two-typos", TWO_TYPOS, 2), ("three", THREE, 3)])
def test_every_command_that_loads_the_file_names_each_mistake(name, text, lines, argv, tmp_path, monkeypatch):
    err = refused(tmp_path, monkeypatch, text, argv)
    check_golden(GOLDEN / f"project-mistakes-{name}.txt", err)
    assert len(err.splitlines()) == lines and "more error" not in err


def test_the_typo_is_reported_as_unknown_not_as_the_key_it_hides(tmp_path, monkeypatch):
    err = refused(tmp_path, monkeypatch, TYPO, ("check", "p.yaml"))
    assert err.startswith("error: p.yaml:9: models[0].training.max_step: unknown key; did you mean `max_steps`? "
                          "valid keys here: max_steps, micro_batch, global_batch,")
    assert "required key is missing" not in err


def test_an_override_typo_is_blamed_on_the_override_and_named_unknown(tmp_path, monkeypatch):
    err = refused(tmp_path, monkeypatch, BASE, ("run", "p.yaml", "--set", "models.tiny.training.max_step=5",
                                                "--set", "models.tiny.model.hiddn=3"))
    check_golden(GOLDEN / "project-mistakes-set-typos.txt", err)
    assert [line.split(": ")[1] for line in err.splitlines()] == ["p.yaml (--set models.tiny.model.hiddn)",
                                                                   "p.yaml (--set models.tiny.training.max_step)"]


def test_a_missing_key_that_no_typo_explains_is_still_reported(tmp_path, monkeypatch):
    """``colour`` is not close to ``hidden``: both the unknown key and the missing one are named, unknown first."""
    text = edit(BASE, ("hidden: 64, ", ""), ("layers: 2,", "layers: 2, colour: red,"))
    err = refused(tmp_path, monkeypatch, text, ("config", "show", "p.yaml"))
    first, second = err.splitlines()
    assert first.startswith("error: p.yaml:6: models[0].model.colour: unknown key; valid keys here: preset, layers, hidden")
    assert "did you mean" not in first
    assert second == "error: p.yaml:6: models[0].model.hidden: required key is missing; add it (see docs/project-file.md)"


def test_a_value_a_union_field_refuses_is_one_mistake_one_line(tmp_path, monkeypatch):
    """``dp: int | 'auto'``: pydantic fails each member under a tag (``dp.int``, ``dp.literal['auto']``)."""
    err = refused(tmp_path, monkeypatch, BASE, ("config", "show", "p.yaml", "--set", "models.0.parallelism.dp=x"))
    assert err == ("error: p.yaml (--set models.0.parallelism.dp): models[0].parallelism.dp: Input should be a valid "
                   "integer, unable to parse string as an integer, or 'auto' (got 'x')\n")


class Inner(StrictModel):
    size: int
    name: str


class Outer(StrictModel):
    items: list[Inner]
    count: int = 0


def test_ordered_errors_put_unknown_keys_first_and_drop_what_they_cause(tmp_path):
    raw = {"count": "many", "items": [{"sise": 1, "name": "a"}, {"size": 2}]}
    with pytest.raises(ValidationError) as info:
        Outer.model_validate(raw)
    kinds = [(e["type"], e["loc"]) for e in ordered_errors(info.value, Outer)]
    assert kinds == [("extra_forbidden", ("items", 0, "sise")), ("missing", ("items", 1, "name")),
                     ("int_parsing", ("count",))]  # items[0].size: missing because of `sise`, left out
    path = tmp_path / "f.yaml"
    path.write_text("count: many\nitems:\n  - sise: 1\n    name: a\n  - size: 2\n")
    assert yaml.safe_load(path.read_text()) == raw
    with pytest.raises(ConfigError) as err:
        load_yaml_model(path, Outer)
    assert str(err.value).splitlines() == [
        f"{path}:3: items[0].sise: unknown key; did you mean `size`? valid keys here: size, name",
        f"{path}:5: items[1].name: required key is missing; add it",
        f"{path}:1: count: Input should be a valid integer, unable to parse string as an integer (got 'many')",
    ]


def test_run_names_the_project_field_of_a_missing_data_source(tmp_path, monkeypatch):
    text = edit(BASE, ('source: "builtin:shakespeare"', "source: corpus.jsonl"))
    err = refused(tmp_path, monkeypatch, text, ("run", "p.yaml"))
    check_golden(GOLDEN / "project-mistakes-missing-source-run.txt", err)
    assert "--input" not in err
    # a blend (Megatron-LM, so no `run` on this GPU-less machine): the entry that names no file
    blend = edit(text, ("    model:", "    framework: megatron\n    model:"), ("gpus_per_node: 0, procs_per_node: 2", "gpus_per_node: 2"),
                 ("source: corpus.jsonl", 'blend: [{source: "builtin:shakespeare", weight: 3}, {source: gone.jsonl, weight: 1}]'))
    (tmp_path / "p.yaml").write_text(blend)
    project = load_project(tmp_path / "p.yaml")
    with pytest.raises(DataError) as info:
        check_source_files(project, project.models[0])
    assert str(info.value).startswith(f"{tmp_path / 'p.yaml'}:8: models.tiny.data.blend[1].source: "
                                      f"{tmp_path / 'gone.jsonl'}: no such file (or the glob matches no files); give a "
                                      "prepared prefix")
    with_set = load_project(tmp_path / "p.yaml", ["models.tiny.data.blend.1.source=other.jsonl"])
    with pytest.raises(DataError, match=r"^\S+p\.yaml: models\.tiny\.data\.blend\[1\]\.source: "):  # not the file's line
        check_source_files(with_set, with_set.models[0])


def test_run_names_the_project_field_of_a_missing_tokenizer(tmp_path, monkeypatch):
    err = refused(tmp_path, monkeypatch, edit(BASE, ("tokenizer: byte", "tokenizer: tok/tokenizer.json")), ("run", "p.yaml"))
    assert err == ("error: p.yaml:7: models.tiny.data.tokenizer: <tmp>/tok/tokenizer.json does not exist; give the path "
                   "of a tokenizer.json (train one with `clustertrain data train-tokenizer`)\n")


#: model-7 four times wider (its MLP too: the flagship gives ffn_hidden) on one node: nothing the planner could set
#: makes it fit 8 H200s
TOO_WIDE = ("models.model-7.plan.nodes=1", "models.model-7.model.hidden=20480", "models.model-7.model.heads=160",
            "models.model-7.model.ffn_hidden=71680")


def sets(*items: str) -> list[str]:
    return [a for item in items for a in ("--set", item)]


def test_plan_names_no_layout_that_does_not_fit_and_exits_2_like_check():
    runner = CliRunner()
    plan = runner.invoke(app, ["plan", str(P5E), *sets(*TOO_WIDE)], prog_name="clustertrain")
    assert plan.exit_code == 2 and plan.stderr == "", plan.output
    line = next(line for line in plan.stdout.splitlines() if line.startswith("infeasible: model-7: "))
    assert "needs 1714.3 GiB per GPU (fsdp 8, grads reduced once per step, bf16 params / fp32 reduce) but 126.4 GiB " \
           "is usable" in line
    assert line.endswith("; no setting makes it fit on 8 GPUs (tried parallelism.grad_sync: per_microbatch, "
                         "parallelism.reshard_after_forward: true, "
                         "parallelism.recompute: selective, parallelism.tp with sequence_parallel: true, parallelism.pp "
                         "alone and together); use a smaller model or GPUs with more memory")
    assert "parallelism.pp: 8 (" not in line  # was: pp 8 "(... 633.9 GiB)" against 126.4 usable
    check = runner.invoke(app, ["check", str(P5E), *sets(*TOO_WIDE)], prog_name="clustertrain")
    assert check.exit_code == 2 and "model-7 is infeasible" in check.stdout


def test_each_setting_the_plan_names_makes_the_model_fit():
    """Replicated (zero_stage 0), model-1 does not fit an H200; the hint names zero_stage 3 and pp 2 (with untied
    embeddings: the flagship's are untied already, a tied variant is told to untie them), and each of them alone
    makes the model feasible."""
    runner = CliRunner()
    ddp = runner.invoke(app, ["plan", str(P5E), *sets("models.model-1.parallelism.zero_stage=0")], prog_name="clustertrain")
    assert ddp.exit_code == 2
    line = next(line for line in ddp.stdout.splitlines() if line.startswith("infeasible: model-1: "))
    assert "; try parallelism.zero_stage: 3, parallelism.pp: 2 (each rank then holds half the layers: 97.7 GiB) (" in line
    assert "tie_embeddings" not in line
    tied = runner.invoke(app, ["plan", str(P5E), *sets("models.model-1.parallelism.zero_stage=0",
                                                       "models.model-1.model.tie_embeddings=true")], prog_name="clustertrain")
    line = next(line for line in tied.stdout.splitlines() if line.startswith("infeasible: model-1: "))
    assert "; try parallelism.zero_stage: 3, parallelism.pp: 2 (each rank then holds half the layers: 97.7 GiB) with " \
           "model.tie_embeddings: false (" in line
    for fix in (["models.model-1.parallelism.zero_stage=3"], ["models.model-1.parallelism.pp=2"]):
        fixed = runner.invoke(app, ["plan", str(P5E), "--format", "json",
                                    *sets("models.model-1.parallelism.zero_stage=0", *fix)], prog_name="clustertrain")
        model = next(m for m in yaml.safe_load(fixed.stdout)["models"] if m["name"] == "model-1")
        assert model["feasible"], (fix, model["reasons"])


def test_check_puts_a_model_nothing_fits_on_its_model_section_and_a_fitting_hint_on_its_parallelism():
    from clustertrain.plan.preflight import reason_field

    assert reason_field(0, "does not fit: ...; try these together: parallelism.recompute: full, parallelism.tp: 8 with "
                           "sequence_parallel: true (5.4 GiB)")[0] == "models[0].parallelism"
    assert reason_field(0, "does not fit: ...; no setting makes it fit on 8 GPUs (tried parallelism.tp, parallelism.pp "
                           "alone and together); use a smaller model or GPUs with more memory")[0] == "models[0].model"


@pytest.mark.parametrize("value, shown", [("1", True), ("true", True), ("YES", True), (" Yes ", True), ("0", False),
                                          ("false", False), ("no", False), ("", False), ("off", False)])
def test_debug_shows_tracebacks_for_1_true_yes_only(value, shown, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.yaml").write_text(TWO_TYPOS)
    result = CliRunner().invoke(app, ["config", "show", "p.yaml"], prog_name="clustertrain",
                                env={"CLUSTERTRAIN_DEBUG": value})
    assert result.exit_code == 2
    assert ("Traceback (most recent call last)" in result.stderr) is shown, result.stderr
    assert [line for line in result.stderr.splitlines() if line.startswith("error: ")] == [
        line for line in (GOLDEN / "project-mistakes-two-typos.txt").read_text().splitlines()]
