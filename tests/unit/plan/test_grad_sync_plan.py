"""The planner's two gradient exchanges (``parallelism.grad_sync``): traffic per step (``per_microbatch`` m
reduce-scatters of the whole model, ``per_step`` one), the memory ``per_step`` holds (every block gathered with an
unsharded gradient in ``reduce_dtype``), the plan naming the choice, and the suggestion of ``per_step`` where it
fits. That these figures are what the ranks send and hold: tests/integration/train/test_grad_sync_ranks.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from clustertrain.core.model_shape import ModelShape
from clustertrain.core.parallel_layout import ParallelLayout
from clustertrain.plan.memory import _held_numel, _local_numel, buffer_bytes, rank_parts
from clustertrain.plan.plan import make_plan
from clustertrain.plan.render import render_plan
from clustertrain.plan.traffic import data_parallel_traffic
from clustertrain.resolve import load_project

P5E = Path(__file__).resolve().parents[3] / "examples" / "p5e-80x7.yaml"
SHAPE = ModelShape(layers=40, hidden=5120, heads=40, seq_len=4096, vocab=32000, ffn_dim=20480)
FLAT = ParallelLayout(world=112, dp=112, zero_stage=3, reshard_after_forward=False, param_dtype="bf16")


def test_per_step_reduces_once_per_step_and_gathers_once():
    m = 11
    each = data_parallel_traffic(SHAPE, FLAT, m, 8, 3200)
    once = data_parallel_traffic(SHAPE, replace(FLAT, grad_sync="per_step"), m, 8, 3200)
    assert (each.gathers, each.reduces) == (m, m) and (once.gathers, once.reduces) == (1, 1)
    assert each.group_bytes == (2 + 4) * each.params * m and once.group_bytes == (2 + 4) * once.params
    # reshard_after_forward true: per_step still re-gathers each block a forward reshards, once per backward
    again = data_parallel_traffic(SHAPE, replace(FLAT, grad_sync="per_step", reshard_after_forward=True), m, 8, 3200)
    assert again.reduces == 1 and 1 < again.gathers < 1 + m


@pytest.mark.parametrize("param, reduce, per_param", [("bf16", "fp32", 2 + 4), ("bf16", "bf16", 2 + 2),
                                                      ("fp32", "fp32", 4 + 4)])
def test_per_step_holds_every_block_gathered_with_its_gradient_in_reduce_dtype(param, reduce, per_param):
    layout = replace(FLAT, param_dtype=param, reduce_dtype=reduce, grad_sync="per_step")
    whole = _held_numel(SHAPE, rank_parts(SHAPE, layout), ParallelLayout(world=1, dp=1))
    assert buffer_bytes(SHAPE, layout) == per_param * whole
    # reshard_after_forward false: per_microbatch gathers every block too, but holds one block's gradient, not all
    block = _local_numel(SHAPE, "block", ParallelLayout(world=1, dp=1))
    e_r = {"bf16": 2, "fp32": 4}[reduce]
    assert buffer_bytes(SHAPE, layout) - buffer_bytes(SHAPE, replace(layout, grad_sync="per_microbatch")) == \
        e_r * (whole - block)


@pytest.fixture(scope="module")
def suggested():
    return make_plan(load_project(P5E, ["models.model-7.parallelism.grad_sync=per_microbatch"]))


def test_the_plan_names_per_step_where_it_fits_and_sends_less(suggested):
    m7 = suggested.model("model-7")
    assert m7.dp_traffic["grad_sync"] == "per_microbatch" and m7.dp_traffic["reduces"] == 11
    assert m7.per_step["fits"] and m7.per_step["node_bytes"] < m7.dp_traffic["node_bytes"] / 10
    assert m7.per_step["memory_bytes"] > m7.memory["total"]
    # reshard_after_forward false: per_microbatch gathers and reduce-scatters 11 times what per_step does once
    assert m7.dp_traffic["node_bytes"] == pytest.approx(11 * m7.per_step["node_bytes"], rel=1e-9)
    # per_step is the flagship's own choice: its memory is what the flagship's plan holds
    assert m7.per_step["memory_bytes"] == make_plan(load_project(P5E)).model("model-7").memory["total"]
    text = render_plan(suggested, "table", 400)
    line = next(x for x in text.splitlines() if "model-7: try parallelism.grad_sync: per_step" in x)
    assert "instead of 11" in line and "77.2 GB into each node per step instead of 849.1 GB" in line
    assert "114.7 GiB per GPU (fits)" in line
    assert "model-1: try parallelism.grad_sync" not in text  # model-1 already has it (the flagship's choice)


def test_no_suggestion_where_per_step_does_not_fit():
    wide = make_plan(load_project(P5E, ["models.model-7.parallelism.grad_sync=per_microbatch",
                                        "models.model-7.model.seq_len=8192"]))
    m7 = wide.model("model-7")   # 96.9 GiB with per_microbatch; per_step would need 147.2 of 126.4 usable
    assert m7.feasible and m7.per_step is not None and not m7.per_step["fits"]
    assert m7.memory["total"] <= m7.memory_budget_bytes < m7.per_step["memory_bytes"]
    assert "model-7: try parallelism.grad_sync" not in render_plan(wide, "table", 400)
