"""Collectives benchmark over torch.distributed (NCCL on GPU, gloo on CPU), nccl-tests style.

``run_collectives(spec)`` measures ``all_reduce, all_gather, broadcast, reduce, reduce_scatter,
alltoall`` for sizes ``min_bytes .. max_bytes`` (times ``factor``): time per op, algbw and busbw
with nccl-tests' bus factors, and a correctness check of every result (inputs are rank-dependent
small integers in float32, so sums are exact and each expected element is known).

Where the ranks come from (:func:`job_env`, the one place that reads the environment):
* inside a job — ``RANK``/``WORLD_SIZE`` (torchrun) or ``SLURM_PROCID``/``SLURM_NTASKS`` (srun):
  every rank calls ``run_collectives``; ``MASTER_ADDR``/``MASTER_PORT`` come from the environment
  (under Slurm, defaults: first host of ``SLURM_JOB_NODELIST``, port 20000 + job id % 20000);
* otherwise ``spec.nproc`` local processes on 127.0.0.1 with a free port (:func:`launch_local`).

Hangs: every operation is started with ``async_op=True`` and waited for with ``spec.timeout_s``;
the rendezvous itself waits ``spec.timeout_s`` for every rank to join (the TCPStore names the
ranks that never did). Ranks report to rank 0 through the store, so a collective that hangs
cannot block the report; rank 0 returns the merged :class:`CollectiveRun` and failed ops carry the
reason. ``spec.fault`` injects a fault (``hang:RANK:OP``, ``corrupt:RANK:OP``, ``absent:RANK``,
``exit:RANK:OP``) to prove the checks catch it.
"""

from __future__ import annotations

import datetime
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, field_validator

from clustertrain.validate.results import ALL_OPS, CollectiveReport, CollectiveRow, CollectiveRun, ValidateError, bus_factor
from clustertrain.validate.thresholds import CPU_SWEEP_MAX_BYTES, GPU_SWEEP_MIN_BYTES

_FAULT_RE = re.compile(r"^(hang|corrupt|exit):(\d+):(\w+)$|^absent:(\d+)$")


class CollectivesConfig(BaseModel):
    """What to measure. Sizes are bytes (the CLI accepts 8, 1K, 4M, 4G)."""

    model_config = ConfigDict(extra="forbid")
    ops: list[str] = Field(default_factory=lambda: list(ALL_OPS), description="Collectives to run, in order.")
    min_bytes: int = Field(default=8, ge=4, description="Smallest message size in bytes.")
    max_bytes: int | None = Field(default=None, ge=4, description="Largest message size in bytes; None: 1 GiB on NCCL "
                                                                 "(where bandwidth bands apply), 1 MiB on gloo (CPU).")
    factor: int = Field(default=2, ge=2, description="Size multiplier between steps.")
    iters: int = Field(default=20, ge=1, description="Timed iterations per size.")
    warmup: int = Field(default=5, ge=0, description="Untimed iterations per size.")
    timeout_s: float = Field(default=60.0, gt=0, description="Per-operation (and rendezvous) timeout in seconds.")
    backend: str | None = Field(default=None, description="nccl or gloo; default nccl when CUDA is available.")
    nproc: int = Field(default=2, ge=1, description="Local processes to start when not inside a distributed job.")
    fault: str | None = Field(default=None, description="Fault injection for self-tests: hang|corrupt|exit:RANK:OP or absent:RANK.")

    @field_validator("ops")
    @classmethod
    def _known_ops(cls, v: list[str]) -> list[str]:
        bad = [o for o in v if o not in ALL_OPS]
        if bad:
            raise ValueError(f"unknown op(s) {', '.join(bad)}; valid ops are: {', '.join(ALL_OPS)}")
        return v

    @field_validator("fault")
    @classmethod
    def _fault(cls, v: str | None) -> str | None:
        if v is not None and not _FAULT_RE.match(v):
            raise ValueError("fault must look like hang:1:all_reduce, corrupt:1:all_gather, exit:1:broadcast or absent:1")
        return v

    def top(self, backend: str | None = None) -> int:
        """``max_bytes``, or the default for ``backend`` (1 GiB on nccl, 1 MiB on gloo) when it is None."""
        if self.max_bytes is not None:
            return self.max_bytes
        return GPU_SWEEP_MIN_BYTES if (backend or self.backend) == "nccl" else CPU_SWEEP_MAX_BYTES

    def sizes(self, backend: str | None = None) -> list[int]:
        top = self.top(backend)
        if top < self.min_bytes:
            raise ValidateError(f"max_bytes {top} is below min_bytes {self.min_bytes}; swap them")
        out, s = [], self.min_bytes
        while s <= top:
            out.append(s)
            s *= self.factor
        return out


@dataclass
class JobEnv:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    source: str  # "torchrun", "slurm" or "local"


def job_env(environ: dict[str, str] | None = None) -> JobEnv | None:
    """The distributed job this process is part of, or None when it is not in one."""
    env = dict(os.environ if environ is None else environ)
    if "RANK" in env and "WORLD_SIZE" in env:
        src, rank, ws = "torchrun", int(env["RANK"]), int(env["WORLD_SIZE"])
        local = int(env.get("LOCAL_RANK", "0"))
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        src, rank, ws = "slurm", int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"])
        local = int(env.get("SLURM_LOCALID", "0"))
    else:
        return None
    addr = env.get("MASTER_ADDR")
    if not addr and src == "slurm":
        addr = _first_slurm_host(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", ""))
    port = env.get("MASTER_PORT") or (str(20000 + int(env.get("SLURM_JOB_ID", "0")) % 20000) if src == "slurm" else "")
    if not addr or not port:
        raise ValidateError("inside a distributed job but MASTER_ADDR/MASTER_PORT are not set; export them "
                            "(e.g. MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -1))")
    return JobEnv(rank, ws, local, addr, int(port), src)


def _first_slurm_host(nodelist: str) -> str | None:
    if not nodelist:
        return None
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=10)
        hosts = out.stdout.split()
        if hosts:
            return hosts[0]
    except (OSError, subprocess.TimeoutExpired):
        pass
    m = re.match(r"([^,\[]+)(?:\[(\d+))?", nodelist)
    return (m.group(1) + (m.group(2) or "")) if m else None


# --------------------------------------------------------------------------- one rank


def _value(rank: int, idx, chunk=None):
    """Input element: small integers, exact in float32 and distinct per rank (and per chunk)."""
    base = (idx % 13) + 1
    return base + 16 * (rank + 1) if chunk is None else base + 16 * (rank + 1) + 1024 * (chunk % 16)


class _Runner:
    def __init__(self, spec: CollectivesConfig, rank: int, n: int, device) -> None:
        import torch

        self.torch, self.spec, self.rank, self.n, self.device = torch, spec, rank, n, device
        self.notes: list[str] = []
        self.rs_fallback = False
        self.fault = _FAULT_RE.match(spec.fault) if spec.fault else None

    def _wait(self, work, what: str) -> None:
        import torch.distributed as dist  # noqa: F401

        if work is None:
            return
        try:
            ok = work.wait(timeout=datetime.timedelta(seconds=self.spec.timeout_s))
        except RuntimeError as e:
            msg = (str(e).splitlines() or [""])[0][:160]
            raise TimeoutError(f"{what} failed or timed out (limit {self.spec.timeout_s:g}s): {msg}") from None
        if ok is False:
            raise TimeoutError(f"{what} did not complete within {self.spec.timeout_s:g}s")

    def _count(self, op: str, nbytes: int) -> tuple[int, int]:
        """(elements in the big buffer, elements per rank chunk) for float32."""
        elems = max(nbytes // 4, 1)
        if op in ("all_gather", "reduce_scatter", "alltoall"):
            chunk = max(elems // self.n, 1)
            return chunk * self.n, chunk
        return elems, elems

    def _buffers(self, op: str, total: int, chunk: int):
        t = self.torch
        idx = t.arange(total, dtype=t.int64, device=self.device)  # built where it is used: 1 GiB sizes on GPUs
        if op == "alltoall":
            inp = _value(self.rank, idx % chunk, idx // chunk).to(t.float32)
            return inp.to(self.device), t.empty(total, dtype=t.float32, device=self.device)
        if op == "all_gather":
            return _value(self.rank, idx[:chunk]).to(t.float32).to(self.device), t.empty(total, dtype=t.float32, device=self.device)
        if op == "reduce_scatter":
            inp = _value(self.rank, idx % chunk, idx // chunk).to(t.float32)
            return inp.to(self.device), t.empty(chunk, dtype=t.float32, device=self.device)
        return _value(self.rank, idx).to(t.float32).to(self.device), None

    def _launch(self, op: str, inp, out):
        import torch.distributed as dist

        if op == "all_reduce":
            return dist.all_reduce(inp, async_op=True)
        if op == "broadcast":
            return dist.broadcast(inp, src=0, async_op=True)
        if op == "reduce":
            return dist.reduce(inp, dst=0, async_op=True)
        if op == "all_gather":
            fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
            return fn(out, inp, async_op=True)
        if op == "alltoall":
            return dist.all_to_all_single(out, inp, async_op=True)
        if op == "reduce_scatter":
            if not self.rs_fallback:
                fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
                try:
                    return fn(out, inp, async_op=True)
                except (RuntimeError, NotImplementedError) as e:
                    self.rs_fallback = True
                    self.notes.append(f"reduce_scatter not supported by this backend ({str(e)[:80]}); "
                                      "measured as all_reduce + slice (busbw is that of all_reduce's traffic)")
            tmp = inp.clone()
            work = dist.all_reduce(tmp, async_op=True)
            self._wait(work, "reduce_scatter (all_reduce fallback)")
            out.copy_(tmp[self.rank * out.numel():(self.rank + 1) * out.numel()])
            return None
        raise ValidateError(f"unknown op {op}")

    def _expected(self, op: str, total: int, chunk: int):
        t = self.torch
        idx = t.arange(total, dtype=t.int64, device=self.device)
        ranks = range(self.n)
        if op == "all_reduce":
            return sum(_value(r, idx) for r in ranks).to(t.float32)
        if op == "broadcast":
            return _value(0, idx).to(t.float32)
        if op == "reduce":
            return sum(_value(r, idx) for r in ranks).to(t.float32) if self.rank == 0 else None
        if op == "all_gather":  # chunk j comes from rank j
            return _value(idx // chunk, idx % chunk).to(t.float32)
        if op == "alltoall":  # chunk j on rank r = rank j's input chunk r
            return _value(idx // chunk, idx % chunk, t.full_like(idx, self.rank)).to(t.float32)
        if op == "reduce_scatter":
            k = idx[:chunk]
            return sum(_value(r, k, t.full_like(k, self.rank)) for r in ranks).to(t.float32)
        raise ValidateError(op)

    def _maybe_fault(self, op: str, stage: str, inp) -> None:
        f = self.fault
        if not f or f.group(1) is None or int(f.group(2)) != self.rank or f.group(3) != op:
            return
        if f.group(1) == "hang" and stage == "start":
            time.sleep(10 * self.spec.timeout_s + 60)
        if f.group(1) == "exit" and stage == "start":
            os._exit(3)
        if f.group(1) == "corrupt" and stage == "input":
            inp.add_(1.0)

    def measure(self, op: str, nbytes: int) -> CollectiveRow:
        t = self.torch
        total, chunk = self._count(op, nbytes)
        size = total * 4
        row = CollectiveRow(size_bytes=size, count=chunk if op in ("all_gather", "reduce_scatter", "alltoall") else total,
                            dtype="float", redop="sum" if op in ("all_reduce", "reduce", "reduce_scatter") else "none",
                            root=0 if op in ("broadcast", "reduce") else -1, time_us=None, algbw_gbps=None, busbw_gbps=None)
        self._maybe_fault(op, "start", None)
        inp, out = self._buffers(op, total, chunk)
        for _ in range(self.spec.warmup):
            self._wait(self._launch(op, inp, out), f"{op} {size} B warmup")
        if self.device.type == "cuda":
            t.cuda.synchronize()
        t0 = time.perf_counter()
        works = [self._launch(op, inp, out) for _ in range(self.spec.iters)]
        for w in works:
            self._wait(w, f"{op} {size} B")
        if self.device.type == "cuda":
            t.cuda.synchronize()
        sec = (time.perf_counter() - t0) / self.spec.iters
        row.time_us = sec * 1e6
        # correctness: fresh inputs, one operation, compare with the known answer
        inp, out = self._buffers(op, total, chunk)
        self._maybe_fault(op, "input", inp)
        self._wait(self._launch(op, inp, out), f"{op} {size} B check")
        got = out if out is not None else inp
        exp = self._expected(op, total, chunk)
        row.wrong = 0 if exp is None else int((got != exp).sum().item())
        return row


def _run_rank(spec: CollectivesConfig, env: JobEnv) -> CollectiveRun | None:
    """Run on one rank. Rank 0 returns the merged run; the others return their own view."""
    import torch
    import torch.distributed as dist

    backend = spec.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(env.local_rank % max(torch.cuda.device_count(), 1))
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    td = datetime.timedelta(seconds=spec.timeout_s)
    store = dist.TCPStore(env.master_addr, env.master_port, env.world_size, is_master=env.rank == 0, timeout=td,
                          wait_for_workers=False)
    run = CollectiveRun(tool="clustertrain", backend=backend, world_size=env.world_size)
    if backend == "nccl":
        try:
            run.nccl_version = ".".join(map(str, torch.cuda.nccl.version()))
        except (AttributeError, RuntimeError):
            pass
    store.set(f"joined/{env.rank}", "1")
    try:
        store.wait([f"joined/{r}" for r in range(env.world_size)], td)
    except RuntimeError:
        missing = [r for r in range(env.world_size) if not store.check([f"joined/{r}"])]
        run.problems.append(f"rank(s) {', '.join(map(str, missing))} never joined within {spec.timeout_s:g}s")
        return run.finish()
    dist.init_process_group(backend, store=store, rank=env.rank, world_size=env.world_size, timeout=td)
    runner = _Runner(spec, env.rank, env.world_size, device)
    broken = None
    for op in spec.ops:
        rep = CollectiveReport(op=op, nranks=env.world_size, complete=True)
        for nbytes in spec.sizes(backend):
            if broken:
                break
            try:
                row = runner.measure(op, nbytes)
            except (TimeoutError, RuntimeError) as e:
                broken = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
                rep.rows.append(CollectiveRow(size_bytes=nbytes, count=0, time_us=None, algbw_gbps=None,
                                              busbw_gbps=None, wrong=None, error=broken))
                rep.problems.append(broken)
                rep.complete = False
                break
            if row.time_us:
                row.algbw_gbps = row.size_bytes / (row.time_us * 1e-6) / 1e9
                row.busbw_gbps = row.algbw_gbps * bus_factor(op, env.world_size)
            rep.rows.append(row)
        if broken and not rep.rows:
            rep.problems.append(f"skipped: an earlier collective failed ({broken})")
            rep.complete = False
        if op == "reduce_scatter" and runner.notes:
            rep.notes.extend(runner.notes)
        run.reports.append(rep)
    # report through the store (works even when the process group is wedged)
    store.set(f"report/{env.rank}", run.model_dump_json())
    if env.rank != 0:
        return _merge_rank_view(run, broken)
    return _merge(run, spec, store, env, broken)


def _merge_rank_view(run: CollectiveRun, broken: str | None) -> CollectiveRun:
    for rep in run.reports:
        bad = [r for r in rep.rows if (r.wrong or 0) > 0]
        if bad:
            rep.problems.append(f"wrong results at {len(bad)} size(s) on this rank")
        rep.failed = bool(rep.problems)
    return run.finish()


def _merge(run: CollectiveRun, spec: CollectivesConfig, store, env: JobEnv, broken: str | None) -> CollectiveRun:
    views: dict[int, CollectiveRun] = {0: run}
    deadline = time.monotonic() + (spec.timeout_s if broken is None else min(spec.timeout_s, 5.0))
    for r in range(1, env.world_size):
        left = max(deadline - time.monotonic(), 0.1)
        try:
            store.wait([f"report/{r}"], datetime.timedelta(seconds=left))
            views[r] = CollectiveRun.model_validate_json(store.get(f"report/{r}"))
        except RuntimeError:
            run.problems.append(f"rank {r} did not report (hung or crashed)")
    for i, rep in enumerate(run.reports):
        for j, row in enumerate(rep.rows):
            wrong_ranks, times = [], []
            for r, v in views.items():
                other = v.reports[i].rows[j] if i < len(v.reports) and j < len(v.reports[i].rows) else None
                if other is None:
                    continue
                if (other.wrong or 0) > 0:
                    wrong_ranks.append(f"{r}:{other.wrong}")
                if other.time_us:
                    times.append(other.time_us)
                if other.error and not row.error:
                    row.error = f"rank {r}: {other.error}"
            if wrong_ranks:
                row.wrong = sum(int(w.split(":")[1]) for w in wrong_ranks)
            if times:  # like nccl-tests: the slowest rank's time
                row.time_us = max(times)
                row.algbw_gbps = row.size_bytes / (row.time_us * 1e-6) / 1e9
                row.busbw_gbps = row.algbw_gbps * bus_factor(rep.op, env.world_size)
            if wrong_ranks:
                rep.problems.append(f"size {row.size_bytes}: wrong elements on rank(s) {', '.join(wrong_ranks)}")
        bw = [r.busbw_gbps for r in rep.rows if r.busbw_gbps is not None]
        rep.avg_busbw_gbps = sum(bw) / len(bw) if bw else None
        for r, v in views.items():
            if r and i < len(v.reports):
                for p in v.reports[i].problems:
                    if p.startswith("skipped") or p in rep.problems:
                        continue
                    rep.problems.append(f"rank {r}: {p}")
        rep.failed = bool(rep.problems)
    if backend_note := ("reduce_scatter measured via all_reduce + slice" if any(
            "all_reduce + slice" in n for rep in run.reports for n in rep.notes) else None):
        run.warnings.append(backend_note)
    return run.finish()


# --------------------------------------------------------------------------- local launcher


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_local(spec: CollectivesConfig) -> CollectiveRun:
    """Start ``spec.nproc`` ranks on 127.0.0.1 and return rank 0's merged result."""
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="ct-coll-")
    out_path = os.path.join(tmp, "rank0.json")
    absent = None
    if spec.fault and (m := _FAULT_RE.match(spec.fault)) and m.group(4) is not None:
        absent = int(m.group(4))
    procs: dict[int, subprocess.Popen] = {}
    logs: dict[int, str] = {}
    for r in range(spec.nproc):
        if r == absent:
            continue
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(spec.nproc), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        logs[r] = os.path.join(tmp, f"rank{r}.log")
        with open(logs[r], "w") as log:
            procs[r] = subprocess.Popen([sys.executable, "-m", "clustertrain.validate.collectives", spec.model_dump_json(),
                                         out_path if r == 0 else ""], env=env, stdout=log, stderr=subprocess.STDOUT)
    n_sizes = len(spec.sizes())
    budget = spec.timeout_s * 3 + 30 + n_sizes * len(spec.ops) * 2
    deadline = time.monotonic() + budget
    p0 = procs.get(0)
    while time.monotonic() < deadline and p0 is not None and p0.poll() is None:
        time.sleep(0.05)
    grace = time.monotonic() + 5
    for r, p in procs.items():
        while p.poll() is None and time.monotonic() < grace:
            time.sleep(0.05)
        if p.poll() is None:
            p.kill()
            p.wait()
    if os.path.exists(out_path):
        run = CollectiveRun.model_validate_json(open(out_path).read())
    else:
        run = CollectiveRun(tool="clustertrain", world_size=spec.nproc)
        tail = open(logs[0]).read().strip().splitlines()[-3:] if 0 in logs else []
        run.problems.append(f"rank 0 produced no result within {budget:g}s: {' | '.join(tail)[:300]}")
        run.finish()
    for r, p in procs.items():
        if p.returncode not in (0, 1) and r != 0:
            run.warnings.append(f"local rank {r} exited with {p.returncode}")
    return run


def run_collectives(spec: CollectivesConfig | None = None, environ: dict[str, str] | None = None) -> CollectiveRun:
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
    return _run_rank(spec, env)


def _worker_main(argv: list[str]) -> int:
    spec = CollectivesConfig.model_validate_json(argv[0])
    env = job_env()
    assert env is not None, "worker started without RANK/WORLD_SIZE"
    run = _run_rank(spec, env)
    if env.rank == 0 and argv[1:] and argv[1]:
        tmp = argv[1] + ".tmp"
        with open(tmp, "w") as f:
            f.write(run.model_dump_json())
        os.replace(tmp, argv[1])
    sys.stdout.flush()
    os._exit(1 if run.failed else 0)  # skip teardown: a wedged process group must not hang the exit


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1:]))
