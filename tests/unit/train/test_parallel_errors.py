"""Bad layouts and a missing compiler: one line naming the field (no ranks, no process group needed)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from clustertrain.core.errors import ConfigError
from clustertrain.project import Project
from clustertrain.train.config import ArchConfig, ParallelismConfig
from clustertrain.core.parallel_layout import LayoutError, ParallelLayout, resolve_layout, structure_problems
from clustertrain.train.trainer import layout_for


def test_resolve_layout_names_the_field():
    with pytest.raises(LayoutError, match=r"parallelism.dp: dp=3 x tp=2 x pp=1 = 6 but the job has 8 ranks"):
        resolve_layout(ParallelismConfig(dp=3, tp=2, zero_stage=3), 8, on_gpu=True)
    with pytest.raises(LayoutError, match=r"parallelism.tp: tp=4 is larger than the 2 ranks of a node"):
        resolve_layout(ParallelismConfig(tp=4, zero_stage=3), 8, on_gpu=True, ranks_per_node=2)
    layout = resolve_layout(ParallelismConfig(tp=2, zero_stage=3, param_dtype="auto"), 8, on_gpu=True)
    assert (layout.dp, layout.tp, layout.param_dtype, layout.dp_rank(5), layout.tp_rank(5)) == (4, 2, "bf16", 2, 1)
    assert resolve_layout(ParallelismConfig(), 2, on_gpu=False).param_dtype == "fp32"


def test_structure_problems_for_heads_ffn_and_vocab():
    arch = ArchConfig(layers=2, hidden=40, heads=5, seq_len=16, vocab=100, ffn_hidden=60)
    problems = structure_problems(arch, ParallelismConfig(tp=2, zero_stage=3))
    assert [field for field, _ in problems] == ["parallelism.tp", "parallelism.tp"]  # 100 is divisible by 2
    assert "does not divide model.heads=5; valid tp: 1, 5" in problems[0][1]
    assert "does not divide model.kv_heads=5 (each tensor-parallel rank holds whole key/value heads); valid tp: 1, 5" \
        in problems[1][1]  # kv_heads defaults to heads
    # grouped-query attention: 8 query heads split 4 ways, but not 2 key/value heads
    gqa = ArchConfig(layers=2, hidden=64, heads=8, kv_heads=2, seq_len=16, vocab=128)
    assert structure_problems(gqa, ParallelismConfig(tp=4, zero_stage=3)) == [
        ("parallelism.tp", "tp=4 does not divide model.kv_heads=2 (each tensor-parallel rank holds whole key/value "
                           "heads); valid tp: 1, 2")]
    assert structure_problems(gqa, ParallelismConfig(tp=2, zero_stage=3)) == []
    arch = ArchConfig(layers=2, hidden=64, heads=4, seq_len=16, vocab=102)
    assert dict(structure_problems(arch, ParallelismConfig(tp=4, zero_stage=3)))["model.vocab"].endswith("round it up to 104")


def test_trainer_layout_error_names_the_model():
    project = Project.model_validate({
        "name": "p", "cluster": {"backend": "local", "gpus_per_node": 0, "procs_per_node": 4},
        "models": [{"name": "m", "model": {"layers": 1, "hidden": 32, "heads": 4, "seq_len": 16},
                    "training": {"max_steps": 1, "micro_batch": 1, "global_batch": 4},
                    "parallelism": {"zero_stage": 3, "tp": 2}}],
    })
    assert isinstance(layout_for(project, project.models[0], 4, on_gpu=False), ParallelLayout)
    with pytest.raises(ConfigError, match=r"^models.m.parallelism.tp: tp=2 does not divide the 3 ranks of a node"):
        layout_for(project, project.models[0], 3, on_gpu=False)


@pytest.mark.slow
def test_compile_without_a_compiler_is_one_line():
    """CXX pointing nowhere is a machine without a C++ compiler for inductor's CPU backend."""
    code = ("import torch\nfrom clustertrain.train.parallel.compile import check_compiler\n"
            "check_compiler(torch.device('cpu'), 'models.m.parallelism.compile')\n")
    res = subprocess.run([sys.executable, "-c", code], env={**os.environ, "CXX": "/nonexistent/g++"},
                         capture_output=True, text=True, timeout=300)
    assert res.returncode != 0
    last = res.stderr.strip().splitlines()[-1]
    assert "ConfigError: models.m.parallelism.compile: torch.compile does not work on this cpu machine" in last
    assert "set compile: false" in last
