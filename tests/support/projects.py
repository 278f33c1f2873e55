"""Tiny project files written by tests: a one-rank local project with one small model and extra sections."""

from __future__ import annotations

from pathlib import Path


def tiny_project(tmp_path: Path, extra: str = "", name: str = "tiny") -> Path:
    """Write ``<tmp_path>/p.yaml``: project ``name`` (local backend, one CPU rank, storage under ``tmp_path/runs``),
    one 2-layer model on the bundled corpus, plus ``extra`` (top-level YAML lines, e.g. an ``image:`` section)."""
    path = tmp_path / "p.yaml"
    path.write_text(f"""name: {name}
cluster: {{backend: local, gpus_per_node: 0, procs_per_node: 1}}
storage: {{root: {tmp_path / 'runs'}}}
{extra}
models:
  - name: tiny
    model: {{layers: 2, hidden: 64, heads: 4, seq_len: 32}}
    data: {{source: "builtin:shakespeare", tokenizer: byte}}
    training: {{max_steps: 1, micro_batch: 1, global_batch: 1}}
""")
    return path
