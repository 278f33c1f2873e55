"""`clustertrain run` with a Megatron-LM model: on this machine's GPUs or a one-line refusal, never the built-in
trainer in its place (this machine has no GPU: nvidia-smi is absent, so both refusals are real here)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from clustertrain.launch.run import local_gpus


def _project(tmp_path, gpus: int):
    path = tmp_path / "p.yaml"
    path.write_text(textwrap.dedent(f"""
        name: mg
        cluster: {{backend: local, gpus_per_node: {gpus}}}
        storage: {{root: {tmp_path / 'runs'}}}
        models:
          - name: tiny
            framework: megatron
            model: {{layers: 2, hidden: 64, heads: 4, seq_len: 32}}
            data: {{source: "builtin:shakespeare", tokenizer: byte}}
            training: {{max_steps: 2, micro_batch: 1, global_batch: 2}}
    """))
    return path


@pytest.mark.parametrize("gpus, message", [
    (0, "cluster.gpus_per_node: 0, but tiny trains with Megatron-LM (framework: megatron), which runs on CUDA GPUs only"),
    (1, "models.tiny.framework: megatron needs 1 CUDA GPU(s) here (cluster.gpus_per_node) but this machine has 0"),
])
def test_run_refuses_a_megatron_model_without_gpus_in_one_line(tmp_path, gpus, message):
    if local_gpus():
        pytest.skip("this machine has GPUs: the refusal cannot happen here")
    proc = subprocess.run([sys.executable, "-m", "clustertrain", "run", str(_project(tmp_path, gpus))],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1 and message in lines[0], lines
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists()  # nothing prepared, nothing written
