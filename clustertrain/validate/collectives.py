"""Collectives benchmark over torch.distributed (NCCL on GPU, gloo on CPU), nccl-tests style: where
its ranks come from. What one rank measures is :mod:`clustertrain.validate.collectives_rank`; what to
measure is :class:`~clustertrain.validate.collectives_config.CollectivesConfig` (re-exported here).

``run_collectives(spec)`` measures ``all_reduce, all_gather, broadcast, reduce, reduce_scatter,
alltoall`` and returns rank 0's merged :class:`~clustertrain.validate.results.CollectiveRun`:

* inside a job (:func:`job_env`: :func:`clustertrain.core.ranks.detect_ranks`, the same rank and
  rendezvous rules as training and the batch scripts) every rank calls ``run_collectives``;
* otherwise :func:`launch_local` starts ``spec.nproc`` ranks on 127.0.0.1 with a free port
  (:func:`clustertrain.launch.local_ranks.start_local_ranks`, the launcher of local training too).
  Each runs ``python -m clustertrain.validate.collectives SPEC_JSON RESULT_PATH``; rank 0 writes its
  merged run to ``RESULT_PATH`` as one JSON object (:class:`CollectiveRun`), atomically.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Mapping

from clustertrain.launch.local_ranks import reap_ranks, start_local_ranks
from clustertrain.core.ranks import RankInfo, detect_ranks
from clustertrain.core.run_paths import write_atomic
from clustertrain.validate.collectives_config import FAULT_RE, CollectivesConfig
from clustertrain.validate.collectives_rank import run_rank
from clustertrain.validate.results import CollectiveRun

__all__ = ["CollectivesConfig", "JobEnv", "job_env", "launch_local", "run_collectives"]

#: the rank value of a process inside a job (the old name, kept for importers)
JobEnv = RankInfo
GRACE_S = 5.0  # after rank 0 has finished (or the budget is spent), for the others to exit


def job_env(environ: Mapping[str, str] | None = None) -> RankInfo | None:
    """The distributed job this process is part of, or None when it is not in one."""
    return detect_ranks(os.environ if environ is None else environ)


def launch_local(spec: CollectivesConfig) -> CollectiveRun:
    """Start ``spec.nproc`` ranks on 127.0.0.1 and return rank 0's merged result. Returns within
    :func:`local_budget_s` plus a few seconds whatever the ranks do: what is still running is killed."""
    absent = None
    if spec.fault and (m := FAULT_RE.match(spec.fault)) and m.group(4) is not None:
        absent = int(m.group(4))
    with tempfile.TemporaryDirectory(prefix="ct-coll-") as tmp:
        out_path = Path(tmp) / "rank0.json"
        logs = {r: Path(tmp) / f"rank{r}.log" for r in range(spec.nproc)}
        argv = [sys.executable, "-m", "clustertrain.validate.collectives", spec.model_dump_json(), str(out_path)]
        procs = start_local_ranks(argv, spec.nproc, logs.__getitem__, skip=[] if absent is None else [absent],
                                  extra_env={"OMP_NUM_THREADS": "1"})
        budget = local_budget_s(spec)
        deadline = time.monotonic() + budget
        p0 = procs.get(0)
        while time.monotonic() < deadline and p0 is not None and p0.poll() is None:
            time.sleep(0.05)
        reap_ranks(procs.values(), GRACE_S)
        if out_path.exists():
            run = CollectiveRun.model_validate_json(out_path.read_text())
        else:
            run = CollectiveRun(tool="clustertrain", world_size=spec.nproc)
            tail = logs[0].read_text(errors="replace").strip().splitlines()[-3:] if 0 in procs else []
            run.problems.append(f"rank 0 produced no result within {budget:g}s: {' | '.join(tail)[:300]}")
            run.finish()
    for r, p in procs.items():
        if p.returncode not in (0, 1) and r != 0:
            run.warnings.append(f"local rank {r} exited with {p.returncode}")
    return run


def local_budget_s(spec: CollectivesConfig) -> float:
    """How long :func:`launch_local` waits for rank 0: three timeouts, 30 s of start-up, 2 s per size and op."""
    return spec.timeout_s * 3 + 30 + len(spec.sizes()) * len(spec.ops) * 2


def run_collectives(spec: CollectivesConfig | None = None, environ: Mapping[str, str] | None = None) -> CollectiveRun:
    """Run the benchmark: inside a job on its ranks (rank 0 gets the merged run), else on local processes."""
    spec = spec or CollectivesConfig()
    if spec.max_bytes is None:  # the default sweep depends on the backend: resolve it once, here
        import torch

        backend = spec.backend or ("nccl" if torch.cuda.is_available() else "gloo")
        spec = spec.model_copy(update={"max_bytes": spec.top(backend)})
    spec.sizes()
    env = job_env(environ)
    if env is None:
        return launch_local(spec)
    return run_rank(spec, env)


def _worker_main(argv: list[str]) -> int:
    spec = CollectivesConfig.model_validate_json(argv[0])
    env = job_env()
    assert env is not None, "worker started without RANK/WORLD_SIZE"
    run = run_rank(spec, env)
    if env.rank == 0 and argv[1:] and argv[1]:
        write_atomic(Path(argv[1]), run.model_dump_json())
    sys.stdout.flush()
    os._exit(1 if run.failed else 0)  # skip teardown: a wedged process group must not hang the exit


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1:]))
