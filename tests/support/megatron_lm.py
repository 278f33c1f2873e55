"""Megatron-LM's own argument parser, from the pinned tag's source (test material, not a double).

``megatron-lm-core_v0.16.1.tar.gz`` holds ``megatron/training``, ``pretrain_gpt.py`` and what they import of
Megatron-LM at tag core_v0.16.1 (commit 55ac7082517c); ``megatron-core==0.16.1`` from PyPI is its ``megatron/core``.
It is on no package registry, so it comes from outside the repository: the file ``$CLUSTERTRAIN_MEGATRON_LM_TARBALL``
names when that is set (then nothing else is looked at: ``=/nonexistent`` shows what a bare clone does), else
``../shared/third_party/megatron-lm-core_v0.16.1.tar.gz`` beside the repository. Without it every test that needs it
is skipped by :func:`require_megatron_tarball`, the reason naming both. :func:`megatron_source` (which calls it)
unpacks it once per fixture; :func:`parse_with_megatron` runs, in one child process (the parser reads ``sys.argv``
and ``RANK``/``WORLD_SIZE`` and prints a lot), Megatron's ``parse_args`` on each argument list and then
``validate_args`` as far as it runs on a CPU machine: it stops at its first CUDA-only check
(``torch.cuda.get_device_properties`` for tp > 1, ...), which is reported, not hidden.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

TOP = "megatron-lm-core_v0.16.1"
#: the environment variable that names the tarball; when set, it is the only place looked at
TARBALL_ENV = "CLUSTERTRAIN_MEGATRON_LM_TARBALL"
#: the documented place beside the repository (leadership's ../shared/third_party)
SHARED_TARBALL = Path(__file__).resolve().parents[3] / "shared" / "third_party" / f"{TOP}.tar.gz"
#: the reason of every skip (one string, so the run's summary groups them)
SKIP_REASON = (f"needs Megatron-LM's source {TOP}.tar.gz (on no package registry): set {TARBALL_ENV} to its path "
               f"or put it at ../shared/third_party/{TOP}.tar.gz")


def megatron_tarball() -> Path | None:
    """The tarball: ``$CLUSTERTRAIN_MEGATRON_LM_TARBALL`` when set (and only it), else ``../shared/third_party``;
    None when that file is not there."""
    named = os.environ.get(TARBALL_ENV)
    path = Path(named).expanduser() if named else SHARED_TARBALL
    return path if path.is_file() else None


def require_megatron_tarball() -> Path:
    """The tarball's path, or skip the calling test or fixture, saying what to set."""
    path = megatron_tarball()
    if path is None:
        pytest.skip(SKIP_REASON)
    return path


_CHILD = r'''
import io, json, os, sys, contextlib, traceback
cases = json.load(sys.stdin)
from megatron.training import arguments as A
out = []
for case in cases:
    os.environ["RANK"] = "0"
    os.environ["WORLD_SIZE"] = str(case["world"])
    for k, v in case.get("env", {}).items():
        os.environ[k] = v
    sys.argv = ["pretrain_gpt.py", *case["args"]]
    err = io.StringIO()
    result = {"accepted": False, "error": None, "validated": None, "stopped": None, "values": {}}
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            args = A.parse_args()
        result["accepted"] = True
    except SystemExit:
        result["error"] = err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else "exit"
        out.append(result)
        continue
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            A.validate_args(args)
        result["validated"] = True
    except Exception as e:  # noqa: BLE001
        text = f"{type(e).__name__}: {e}"
        cuda = any(w in text for w in ("CUDA", "cuda", "NVIDIA", "Torch not compiled", "device"))
        result["validated"] = False
        result["stopped"] = text[:400]
        result["cuda_stop"] = cuda
    for key in case.get("read", []):
        v = getattr(args, key, None)
        result["values"][key] = v if isinstance(v, (int, float, str, bool, type(None), list)) else str(v)
    out.append(result)
    for k in case.get("env", {}):
        os.environ.pop(k, None)
print("@@RESULT@@" + json.dumps(out))
'''


@dataclass
class ParseResult:
    accepted: bool
    error: str | None
    validated: bool | None
    stopped: str | None
    cuda_stop: bool
    values: dict


def megatron_source(base: Path) -> Path:
    """Unpack the tarball below ``base`` (once) and return Megatron-LM's top directory; skip the calling test or
    fixture when there is no tarball (:func:`require_megatron_tarball`)."""
    tarball = require_megatron_tarball()
    top = base / TOP
    if not (top / "pretrain_gpt.py").is_file():
        with tarfile.open(tarball) as tar:
            tar.extractall(base, filter="data")
    return top


def parse_with_megatron(source: Path, cases: list[dict]) -> list[ParseResult]:
    """``cases``: ``{"args": [...], "world": N, "env": {...}, "read": [attribute names]}``."""
    env = {**os.environ, "PYTHONPATH": str(source), "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, "-c", _CHILD], input=json.dumps(cases), capture_output=True, text=True,
                          cwd=source, env=env, timeout=300)
    marker = [line for line in proc.stdout.splitlines() if line.startswith("@@RESULT@@")]
    assert marker, f"Megatron-LM's parser did not run: {proc.stderr[-2000:]}"
    rows = json.loads(marker[-1].removeprefix("@@RESULT@@"))
    return [ParseResult(r["accepted"], r["error"], r["validated"], r["stopped"], r.get("cuda_stop", False), r["values"])
            for r in rows]


_BUILD_CHILD = r'''
import io, json, os, sys, contextlib
cases = json.load(sys.stdin)
os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
import torch, torch.distributed as dist
from megatron.training import arguments as A
from megatron.training.global_vars import set_args
dist.init_process_group("gloo", rank=0, world_size=1)
from megatron.core import parallel_state
parallel_state.initialize_model_parallel(1, 1)
from gpt_builders import gpt_builder
out = []
for case in cases:
    sys.argv = ["pretrain_gpt.py", *case["args"], *CPU_ONLY]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        args = A.parse_args()
        A.validate_args(args)
        set_args(args)
        model = gpt_builder(args, True, True)
    rope = getattr(model, "rotary_pos_emb", None)
    out.append({"params": {n: list(p.shape) for n, p in model.named_parameters()},
                "inv_freq": rope.inv_freq.tolist() if rope is not None else None,
                "eps": model.config.layernorm_epsilon, "groups": model.config.num_query_groups})
print("@@RESULT@@" + json.dumps(out))
'''

#: what a CPU without Apex or Transformer Engine needs to build the model (not rendered: the image has GPUs):
#: CPU initialisation, torch's norms instead of Apex's persistent LayerNorm kernel, no fused weight-gradient kernel
CPU_ONLY = ["--use-cpu-initialization", "--no-persist-layer-norm", "--no-gradient-accumulation-fusion"]


def build_with_megatron(source: Path, cases: list[dict]) -> list[dict]:
    """Megatron-LM's own ``gpt_builder`` (``gpt_builders.py``, what ``pretrain_gpt.py`` calls) on each argument list
    (tp 1, pp 1, ``--transformer-impl local``) after ``parse_args`` and ``validate_args``, in one child process
    with a one-rank gloo group: per case the parameter names and shapes, the rotary inverse frequencies, the norm
    epsilon and the key/value groups of the model it builds."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    child = _BUILD_CHILD.replace("*CPU_ONLY", "*" + json.dumps(CPU_ONLY))
    env = {**os.environ, "PYTHONPATH": str(source), "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, "-c", child, str(port)], input=json.dumps(cases), capture_output=True,
                          text=True, cwd=source, env=env, timeout=300)
    marker = [line for line in proc.stdout.splitlines() if line.startswith("@@RESULT@@")]
    assert marker, f"Megatron-LM's gpt_builder did not run: {proc.stderr[-3000:]}"
    return json.loads(marker[-1].removeprefix("@@RESULT@@"))
