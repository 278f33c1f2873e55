"""Real gloo ranks for tests that run a file as a script on every rank (``python FILE OUT`` with the
``torch.distributed`` environment variables set): :func:`launch_ranks` starts and waits for them, and
:func:`local_state_bytes` is what a rank holds of a model and its AdamW states (for the planner's byte tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from clustertrain.launch.local_ranks import free_port

ROOT = Path(__file__).resolve().parents[2]


def launch_ranks(script: str, out: Path, world: int, timeout: float = 900) -> dict:
    """Run ``script OUT`` on ``world`` gloo ranks (one thread each); every rank must exit 0; the ranks' result is
    ``OUT/result.json`` (rank 0 writes it)."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, script, str(out)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    logs = [p.communicate(timeout=timeout)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-3000:] for log in logs)
    return json.loads((out / "result.json").read_text())


def local_state_bytes(model, optimizer) -> dict[str, int]:
    """Bytes of this rank's local parameters, their gradients and AdamW states (DTensors: their local shards)."""
    def nbytes(t) -> int:
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.numel() * t.element_size()

    params = list(model.parameters())
    optim = sum(nbytes(v) for p in params for v in optimizer.state[p].values() if hasattr(v, "numel"))
    return {"params": sum(nbytes(p) for p in params), "grads": sum(nbytes(p.grad) for p in params),
            "optimizer": optim}
