"""One rank of the collectives benchmark: measure, check, and report to rank 0 (nccl-tests style).

:func:`run_rank` measures ``spec.ops`` for sizes ``min_bytes .. max_bytes`` (times ``factor``): time
per op, algbw and busbw with nccl-tests' bus factors, and a correctness check of every result (inputs
are rank-dependent small integers in float32, so sums are exact and each expected element is known).

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
import time

from clustertrain.core.ranks import RankInfo
from clustertrain.validate.collectives_config import FAULT_RE, CollectivesConfig
from clustertrain.validate.results import CollectiveReport, CollectiveRow, CollectiveRun, ValidateError, bus_factor


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
        self.fault = FAULT_RE.match(spec.fault) if spec.fault else None

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


def run_rank(spec: CollectivesConfig, env: RankInfo) -> CollectiveRun | None:
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


def _merge(run: CollectiveRun, spec: CollectivesConfig, store, env: RankInfo, broken: str | None) -> CollectiveRun:
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
