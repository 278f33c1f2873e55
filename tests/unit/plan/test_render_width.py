"""`plan`'s tables fit the terminal as `status`'s do (issue 36 item 6): ``render_plan(..., width)`` keeps every table
line within the width, wraps words, never cuts a figure, and names the columns it leaves out; ``clustertrain plan``
takes the terminal's width (``COLUMNS`` on a pipe, else the old 160). A project without GPUs is planned in its own
words: ranks, GiB/rank, CPU-h, memory per rank."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from clustertrain.plan.plan import make_plan
from clustertrain.plan.render import TABLE_WIDTH, render_plan
from clustertrain.resolve import load_project

ROOT = Path(__file__).resolve().parents[3]
P5E = ROOT / "examples" / "p5e-80x7.yaml"
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
BOX = "┏┃┡│└"


@pytest.fixture(scope="module")
def flagship():
    return make_plan(load_project(P5E))


@pytest.fixture(scope="module")
def quickstart():
    return make_plan(load_project(QUICKSTART))


def table_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line[:1] in BOX]


def cells(text: str) -> set[str]:
    """Every cell's text on one line of a table (a wrapped cell's parts come out separately)."""
    return {c.strip() for line in table_lines(text) for c in re.split(r"[┃│]", line) if c.strip()}


@pytest.mark.parametrize("width", [70, 90, 110, 130])
def test_every_table_line_fits_the_width_and_every_figure_stays_whole(flagship, width):
    text = render_plan(flagship, "table", width)
    assert max(len(line) for line in table_lines(text)) <= width
    shown = cells(text)
    for whole in ("$120,412", "27,841", "22,167", "114.7", "126.4 GiB"):  # model-7's cost and GPU-h, model-1's ...
        assert whole in shown, (width, whole)
    # the architecture lines under the models table are not cut either: each model's shape stays on one line
    lines = text.splitlines()
    for shape in ("model-6: 32 layers, hidden 4096, 32 heads, ffn 14336; Llama-style: rope, GQA 8 kv heads",
                  "  - model-7: 40 layers, hidden 5120, 40 heads, ffn 17920; Llama-style: rope, GQA 8 kv heads"):
        assert any(shape in line for line in lines), (width, shape)
    hidden = re.findall(r"not shown at this width: (.*) \(widen the terminal, or --format json\)", text)
    if width < 100:
        assert hidden and "tokens" in hidden[0]  # left out, and said
    models = text.split("\nmemory per")[0]  # the models table and its caption
    header = table_lines(models)[1]
    assert " model " in header and " cost " in header and " GPU-h " in header  # the columns that always stay
    for caption in re.findall(r"not shown at this width: (.*) \(", models):
        assert all(f" {name} " not in header for name in caption.split(", "))  # what it says is left out, is


def test_the_default_width_is_the_old_fixed_one(flagship):
    assert render_plan(flagship, "table") == render_plan(flagship, "table", TABLE_WIDTH)
    assert "not shown at this width" not in render_plan(flagship, "table")  # everything fits at 160, as before


def test_a_cpu_project_is_planned_in_ranks_cpu_hours_and_memory_per_rank(quickstart, flagship):
    for text in (render_plan(quickstart, "table"), render_plan(quickstart, "markdown")):
        assert "ranks" in text and "GiB/rank" in text and "CPU-h" in text and "memory per rank" in text.lower()
        assert "GiB/GPU" not in text and "GPU-h" not in text and "memory per gpu" not in text.lower()
    doc = json.loads(render_plan(quickstart, "json"))
    assert doc["models"][0]["gpus"] == 2 and "gpu_hours" in doc["models"][0]  # the JSON keys stay
    gpu = render_plan(flagship, "markdown")
    assert "| GPUs |" in gpu and "GiB/GPU" in gpu and "GPU-h" in gpu and "CPU-h" not in gpu


def _cli():
    from clustertrain.cli.plan import plan_command

    app = typer.Typer()
    app.command("plan")(plan_command)
    app.command("other")(lambda: None)
    return app


def test_the_plan_command_fits_its_tables_to_columns(flagship):
    runner = CliRunner()
    narrow = runner.invoke(_cli(), ["plan", str(P5E)], env={"COLUMNS": "84"})
    assert narrow.exit_code == 0, narrow.output
    assert max(len(line) for line in table_lines(narrow.output)) <= 84
    assert "not shown at this width" in narrow.output
    piped = runner.invoke(_cli(), ["plan", str(P5E)], env={"COLUMNS": None})  # a pipe without COLUMNS: as before
    assert piped.exit_code == 0 and piped.output.rstrip("\n") == render_plan(flagship, "table").rstrip("\n")
