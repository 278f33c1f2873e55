"""The Llama-family options of ``models[].model`` (issue 39): presets, the SwiGLU width rule, and each mistake as one
line naming the field and the fix, exit 2, nothing written (``clustertrain check`` and ``run`` load the file the
same way)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from clustertrain.cli import app
from clustertrain.core.model_shape import ModelShape
from clustertrain.train.config import PRESETS, ArchConfig

BASE = """name: arch
cluster: {backend: local, gpus_per_node: 0, procs_per_node: 2}
storage: {root: runs}
models:
  - name: tiny
    model: {MODEL}
    data: {source: "builtin:shakespeare", tokenizer: byte}
    parallelism: {PAR}
    training: {max_steps: 1, micro_batch: 1, global_batch: 2}
"""

#: published parameter counts (each model card / paper), to the planner's count's precision
PUBLISHED = {"llama3-8b": 8.03e9, "llama3-70b": 70.55e9, "llama3.2-1b": 1.24e9, "llama2-7b": 6.74e9,
             "llama2-13b": 13.02e9, "smollm2-135m": 0.1345e9, "gpt2": 0.1244e9}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_each_preset_has_its_published_parameter_count(name):
    arch = ArchConfig(preset=name)
    assert ModelShape.from_arch(arch, arch.vocab).total_params() == pytest.approx(PUBLISHED[name], rel=0.006)


def test_a_field_beside_the_preset_overrides_it_and_llamas_ffn_rule():
    arch = ArchConfig(preset="llama3-8b", seq_len=2048, vocab=32000)
    assert (arch.seq_len, arch.vocab, arch.kv_head_count, arch.position, arch.bias) == (2048, 32000, 8, "rope", False)
    # Llama 3 8B's rule (multiplier 1.3, multiple_of 1024) gives its 14336; Llama 2 7B's (multiple_of 256) 11008
    rule = dict(layers=1, hidden=4096, heads=32, seq_len=8, mlp="swiglu")
    assert ArchConfig(**rule, ffn_multiplier=1.3, ffn_multiple_of=1024).ffn_dim == 14336
    assert ArchConfig(**rule, ffn_multiple_of=256).ffn_dim == 11008
    assert ArchConfig(**rule).ffn_dim == 10944  # the earlier default: 8/3 x hidden rounded up to 64
    assert set(PRESETS) >= {"llama3-8b", "smollm2-135m", "gpt2"}


@pytest.mark.parametrize("model,par,field,fix", [
    ("{layers: 2, hidden: 64, heads: 4, kv_heads: 3, seq_len: 32}", "{}", "kv_heads (3) must divide heads (4)",
     "kv_heads="),
    ("{layers: 2, hidden: 60, heads: 4, seq_len: 32, position: rope}", "{}", "position rope needs an even head dimension",
     "hidden / heads = 60 / 4 = 15"),
    ("{layers: 2, hidden: 64, heads: 4, kv_heads: 1, seq_len: 32}", "{zero_stage: 3, tp: 2}",
     "tp=2 does not divide model.kv_heads=1", "valid tp: 1"),
    ("{preset: llama9-1b, seq_len: 32}", "{}", "preset 'llama9-1b' is unknown", "llama3-8b"),
])
def test_a_bad_architecture_is_one_line_exit_2_and_nothing_written(model, par, field, fix, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = Path("p.yaml")
    path.write_text(BASE.replace("{MODEL}", model).replace("{PAR}", par))
    result = CliRunner().invoke(app, ["run", str(path)])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: ") and field in lines[0] and fix in lines[0], lines
    assert "p.yaml" in lines[0] or "models[0]" in lines[0] or "models.0" in lines[0]
    assert not Path("runs").exists()
