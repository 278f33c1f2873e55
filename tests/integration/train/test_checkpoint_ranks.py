"""Checkpoints across real gloo ranks: resharding between layouts (FSDP2, dp x tp, DDP, one plain process),
RNG at an unchanged layout, and SIGKILL during an asynchronous save.

The ranks run this file as a script (``python test_checkpoint_ranks.py PHASES...``, see :func:`worker`);
each rank writes what it found to ``<out>/rank<R>.json`` and the tests assert on those files.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from torch.distributed.checkpoint import FileSystemWriter

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

pytestmark = pytest.mark.slow
VOCAB, HIDDEN, FFN = 30, 16, 24  # 30 rows over 4 ranks: uneven FSDP chunks (8, 8, 8, 6)


# -- the ranks' side ------------------------------------------------------------------------------
def build(kind: str, seed: int):
    """A tiny model + AdamW laid out as ``kind``: plain | ddp | fsdp (1-D mesh) | tp (dp x tp=2 mesh + FSDP2)."""
    import torch
    import torch.distributed as dist
    from torch import nn

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(VOCAB, HIDDEN)
            self.up = nn.Linear(HIDDEN, FFN)
            self.down = nn.Linear(FFN, HIDDEN)
            self.head = nn.Linear(HIDDEN, VOCAB)

        def forward(self, x):
            h = self.emb(x)
            h = h + self.down(torch.nn.functional.gelu(self.up(h)))
            return self.head(h)

    torch.manual_seed(seed)
    model = Tiny()
    torch.manual_seed(seed * 100 + (dist.get_rank() if dist.is_initialized() else 0))  # each rank its own stream
    if kind == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
    elif kind in ("fsdp", "tp"):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        world = dist.get_world_size()
        if kind == "tp":
            from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

            mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
            parallelize_module(model, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
            dp_mesh = mesh["dp"]
        else:
            dp_mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
        for part in (model.emb, model.up, model.down, model.head):
            fully_shard(part, mesh=dp_mesh)
        fully_shard(model, mesh=dp_mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)


def train(model, optimizer, steps: int, seed: int) -> None:
    import torch

    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randint(0, VOCAB, (4, 8), generator=gen)
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.roll(1, 1).flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def full_state(model, optimizer) -> dict:
    """Every parameter and optimizer tensor, whole, by name (on rank 0; collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    import torch.distributed as dist

    opts = StateDictOptions(full_state_dict=True, cpu_offload=dist.is_initialized())
    msd, osd = get_state_dict(model, optimizer, options=opts)
    flat = {f"model.{k}": v.detach().clone() for k, v in msd.items()}
    for fqn, st in osd.get("state", {}).items():
        flat.update({f"optim.{fqn}.{k}": v.detach().clone() for k, v in st.items()})
    return flat


def differences(want: dict, got: dict) -> list[str]:
    import torch

    if sorted(want) != sorted(got):
        return [f"keys differ: {sorted(set(want) ^ set(got))}"]
    return [k for k in want if not torch.equal(want[k], got[k])]


def manager(root: Path, kind: str, writer=None):
    import torch.distributed as dist

    from clustertrain.train.checkpoint import CheckpointManager
    from clustertrain.train.checkpoint_async import file_writer

    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    return CheckpointManager(root, keep_last=3, fingerprint="f", project="p", model_name="m", rank=rank,
                             world_size=world, layout={"world": world, "kind": kind}, writer=writer or file_writer)


class SlowWriter(FileSystemWriter):
    """A FileSystemWriter whose data write first sleeps: an async save that stays in flight. (Module level: the
    writer is pickled to the checkpoint writer process.)"""

    def write_data(self, plan, planner):
        time.sleep(120)
        return super().write_data(plan, planner)


class FullWriter(FileSystemWriter):
    """A FileSystemWriter whose data write fails after a moment, as on a full file system."""

    def write_data(self, plan, planner):
        import errno

        time.sleep(1)
        raise OSError(errno.ENOSPC, "No space left on device")


class FileOps:
    """Counts this process's file-system calls under ``root`` while active: ``open``, ``os.listdir`` and
    ``os.scandir`` through a real audit hook (``sys.addaudithook``: CPython raises these events), ``os.stat`` (which
    raises no audit event; ``Path.stat``/``is_file``/``is_dir``/``exists`` go through it) through a pass-through
    wrapper that calls the real function. Audit hooks cannot be removed: the hook stays, counting only while on."""

    def __init__(self, root: Path):
        self.root, self.on, self.counts = str(root), False, {"open": 0, "listdir": 0, "scandir": 0, "stat": 0}
        sys.addaudithook(self._audit)

    def _audit(self, event, args):
        if self.on and event in ("open", "os.listdir", "os.scandir") and args and str(args[0]).startswith(self.root):
            self.counts[event.removeprefix("os.")] += 1

    def __enter__(self):
        real = self._real = os.stat

        def counted(path, *a, **kw):
            if self.on and str(path).startswith(self.root):
                self.counts["stat"] += 1
            return real(path, *a, **kw)

        os.stat, self.on = counted, True
        return self

    def __exit__(self, *exc):
        os.stat, self.on = self._real, False


def worker(out: Path, phases: list[str]) -> None:
    """Phases: ``save:KIND:DIR`` (train 2 steps, save step 2, write DIR/ref.pt, record the next torch.rand),
    ``load:KIND:DIR`` (fresh model, load, compare with DIR/ref.pt), ``async-kill:DIR`` (save step 1 async +
    keep training + wait; then an async save that stays in flight; then wait to be killed), ``async-agree:DIR``
    (an async save whose write fails; each step the ranks all-reduce :meth:`finished_step` and commit the agreed
    one, rank 1 looking only after its write surely finished, rank 0 at once: both must fail at the same step)."""
    import torch
    import torch.distributed as dist

    from clustertrain.core.checkpoint_format import find_latest
    from clustertrain.train.checkpoint_state import TrainState, app_state

    if "WORLD_SIZE" in os.environ:
        import datetime

        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank() if dist.is_initialized() else 0
    report: dict = {}
    for phase in phases:
        action, *args = phase.split(":")
        if action == "save":
            kind, root = args[0], Path(args[1])
            model, opt = build(kind, seed=1)
            train(model, opt, 2, seed=10 + (rank // 2 if kind == "tp" else rank))  # a tp pair reads one batch
            mgr = manager(root, kind)
            path = mgr.save(2, 32, app_state(model, opt, TrainState(2, 32)))
            ref = full_state(model, opt)
            if rank == 0:
                torch.save(ref, root / "ref.pt")
            report[phase] = {"path": str(path), "next_rand": torch.rand(3).tolist()}
        elif action == "load":
            kind, root = args[0], Path(args[1])
            model, opt = build(kind, seed=2)
            train(model, opt, 1, seed=20 + rank)  # optimizer state exists, values differ from the checkpoint
            mgr = manager(root, kind)
            before = full_state(model, opt)
            ts = TrainState()
            meta = mgr.load(find_latest(root), app_state(model, opt, ts))
            after = full_state(model, opt)
            rand = torch.rand(3).tolist()
            ref = torch.load(root / "ref.pt") if rank == 0 else None
            report[phase] = {"same_layout": mgr.same_layout(meta), "train": ts.state_dict(), "next_rand": rand,
                             "layout": meta.layout, "changed": bool(ref and differences(ref, before)),
                             "diff": differences(ref, after) if rank == 0 else []}
            train(model, opt, 1, seed=30 + rank)  # training continues from the loaded state
        elif action == "async-kill":
            root = Path(args[0])
            model, opt = build("fsdp", seed=1)
            train(model, opt, 1, seed=10 + rank)
            mgr = manager(root, "fsdp")
            t0 = time.perf_counter()
            assert mgr.save(1, 16, app_state(model, opt, TrainState(1, 16)), async_save=True) is None
            stall = time.perf_counter() - t0
            ref = full_state(model, opt)
            train(model, opt, 1, seed=20 + rank)  # changes the live tensors while the save is in flight
            committed = mgr.wait()
            if rank == 0:
                torch.save(ref, root / "ref.pt")
            report[phase] = {"committed": str(committed) if committed else None, "stall_s": stall}
            mgr.writer = lambda path: SlowWriter(str(path))
            mgr.save(2, 32, app_state(model, opt, TrainState(2, 32)), async_save=True)
            report[phase]["writer_pid"] = mgr._async.writer_pid
            (out / f"rank{rank}.json").write_text(json.dumps(report))
            time.sleep(300)  # killed here, mid-write
        elif action == "async-agree":
            from clustertrain.core.errors import RunDirError

            mgr = manager(Path(args[0]), "fsdp", writer=lambda path: FullWriter(str(path)))
            model, opt = build("fsdp", seed=1)
            mgr.save(1, 16, app_state(model, opt, TrainState(1, 16)), async_save=True)
            if rank == 1:
                time.sleep(3)  # its write has failed by now; rank 0's first look comes before that
            failed_at, line, mine = None, "", []
            for step in range(2, 40):
                mine.append(mgr.finished_step())
                agreed = torch.tensor([mine[-1]], dtype=torch.int32)
                dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
                try:
                    mgr.commit_finished(int(agreed))
                except RunDirError as e:
                    failed_at, line = step, str(e)
                    break
                train(model, opt, 1, seed=step)  # a training step: collectives a rank that left would break
                time.sleep(0.1)
            report[phase] = {"failed_at": failed_at, "line": line, "seen": mine}
            mgr.close()
        elif action == "resume-count":  # three checkpoints at this world size, then a resume counted per rank
            root = Path(args[0])
            model, opt = build("fsdp", seed=1)
            mgr = manager(root, "fsdp")
            for step in (1, 2, 3):
                train(model, opt, 1, seed=step)
                mgr.save(step, 16 * step, app_state(model, opt, TrainState(step, 16 * step)), async_save=step > 1)
            mgr.close()
            dist.barrier()
            fresh, fresh_opt = build("fsdp", seed=2)
            ts = TrainState()
            with FileOps(root) as ops:
                loaded = manager(root, "fsdp").load_latest(app_state(fresh, fresh_opt, ts))
            files = sum(1 for c in root.glob("step_*") for _ in c.iterdir())
            report[phase] = {"counts": ops.counts, "files": files, "step": ts.step,
                             "path": str(loaded.path), "diff": differences(full_state(model, opt),
                                                                           full_state(fresh, fresh_opt))}
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


# -- the test side --------------------------------------------------------------------------------
def start(world: int, out: Path, *phases: str) -> list[subprocess.Popen]:
    from clustertrain.launch.local_ranks import free_port

    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), OMP_NUM_THREADS="1",
               PYTHONWARNINGS="ignore", PYTHONPATH=str(ROOT))
    return [subprocess.Popen([sys.executable, __file__, str(out), *phases], env={**env, "RANK": str(r)},
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
            for r in range(world)]


def run_ranks(world: int, out: Path, *phases: str, timeout: float = 240) -> list[dict]:
    """Run the phases on ``world`` ranks; the first rank that fails fails the test with its output."""
    procs = start(world, out, *phases)
    deadline = time.time() + timeout
    try:
        while any(p.poll() is None for p in procs):
            failed = [p for p in procs if p.poll() not in (None, 0)]
            assert not failed and time.time() < deadline, \
                (failed or procs)[0].stdout.read()[-3000:] if failed else "ranks timed out"
            time.sleep(0.1)
        for p in procs:
            assert p.returncode == 0, p.stdout.read()[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """At 4 ranks: save FSDP2 (A) and dp 2 x tp 2 (B); reload A at the same layout; load B into FSDP2 x 4."""
    base = tmp_path_factory.mktemp("ckpt")
    a, b = base / "fsdp4", base / "dp2tp2"
    reports = run_ranks(4, base / "out4", f"save:fsdp:{a}", f"save:tp:{b}", f"load:fsdp:{a}", f"load:fsdp:{b}")
    return a, b, reports


def test_same_layout_restores_parameters_moments_and_each_ranks_rng(saved):
    a, _, reports = saved
    for r, rep in enumerate(reports):
        saved_, loaded = rep[f"save:fsdp:{a}"], rep[f"load:fsdp:{a}"]
        assert loaded["same_layout"] and loaded["train"] == {"step": 2, "consumed_samples": 32}
        assert loaded["next_rand"] == saved_["next_rand"], f"rank {r}: RNG stream not restored"
    assert reports[0][f"load:fsdp:{a}"]["changed"] and reports[0][f"load:fsdp:{a}"]["diff"] == []
    assert reports[0][f"load:fsdp:{a}"]["layout"] == {"world": 4, "kind": "fsdp"}
    assert len({tuple(rep[f"save:fsdp:{a}"]["next_rand"]) for rep in reports}) == 4  # four distinct streams


def test_dp2_tp2_checkpoint_loads_exactly_into_fsdp4(saved):
    _, b, reports = saved
    loaded = reports[0][f"load:fsdp:{b}"]
    assert not loaded["same_layout"] and loaded["changed"]
    assert loaded["diff"] == [], f"tensors that differ after resharding: {loaded['diff']}"
    assert all(rep[f"load:fsdp:{b}"]["train"] == {"step": 2, "consumed_samples": 32} for rep in reports)


def test_fsdp4_checkpoint_loads_at_two_ranks_and_ddp_at_fsdp(saved, tmp_path):
    a, _, _ = saved
    c = tmp_path / "ddp2"
    reports = run_ranks(2, tmp_path / "out2", f"load:fsdp:{a}", f"save:ddp:{c}", f"load:fsdp:{c}")
    for phase in (f"load:fsdp:{a}", f"load:fsdp:{c}"):
        rep = reports[0][phase]
        assert rep["changed"] and rep["diff"] == [], (phase, rep["diff"])
        assert all(r[phase]["train"] == {"step": 2, "consumed_samples": 32} for r in reports)
    assert not reports[0][f"load:fsdp:{a}"]["same_layout"]


def test_fsdp4_checkpoint_loads_into_one_plain_process(saved, tmp_path):
    a, _, _ = saved
    (report,) = run_ranks(1, tmp_path / "out1", f"load:plain:{a}")
    rep = report[f"load:plain:{a}"]
    assert rep["changed"] and rep["diff"] == [] and rep["train"] == {"step": 2, "consumed_samples": 32}


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie waiting for its reaper does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_sigkill_during_async_save_leaves_latest_at_the_previous_checkpoint(tmp_path):
    from clustertrain.core.checkpoint_format import find_latest, read_meta
    from clustertrain.train.checkpoint import clean_stale

    root, out = tmp_path / "ckpt", tmp_path / "out"
    procs = start(2, out, f"async-kill:{root}")
    try:
        deadline = time.time() + 120
        while not all((out / f"rank{r}.json").exists() for r in range(2)):
            assert time.time() < deadline and all(p.poll() is None for p in procs), \
                [p.communicate()[0][-2000:] for p in procs if p.poll() is not None]
            time.sleep(0.1)
        time.sleep(0.5)  # both ranks are inside the slow write of step 2
        assert (root / ".tmp-step_00000002").is_dir() and not (root / "step_00000002").exists()
        writers = [json.loads((out / f"rank{r}.json").read_text())[f"async-kill:{root}"]["writer_pid"]
                   for r in range(2)]
        assert all(alive(pid) for pid in writers)  # each rank's writer process, inside its slow write
        for p in procs:  # SIGKILL the ranks alone: their writer processes must follow, not finish the write
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
        deadline = time.time() + 5
        while any(alive(pid) for pid in writers) and time.time() < deadline:
            time.sleep(0.05)
        assert not any(alive(pid) for pid in writers), "a writer process outlived its SIGKILLed rank"
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
    first = json.loads((out / "rank0.json").read_text())[f"async-kill:{root}"]
    assert first["committed"] == str(root / "step_00000001")
    assert json.loads((out / "rank1.json").read_text())[f"async-kill:{root}"]["committed"] is None
    assert (root / "latest").read_text().strip() == "step_00000001"
    assert find_latest(root) == root / "step_00000001" and read_meta(root / "step_00000001").step == 1
    clean_stale(root)
    assert not (root / ".tmp-step_00000002").exists()
    # a new run resumes from it: the values as of the async save, not the step trained while it was written
    (report,) = run_ranks(1, tmp_path / "resume", f"load:plain:{root}")
    rep = report[f"load:plain:{root}"]
    assert rep["diff"] == [] and rep["train"] == {"step": 1, "consumed_samples": 16}


if __name__ == "__main__":
    worker(Path(sys.argv[1]), sys.argv[2:])


def test_an_async_save_fails_on_every_rank_at_the_same_step(tmp_path):
    """Each rank learns that its async write finished at its own moment; committing at the agreed step (the
    minimum of every rank's finished step) makes them all stop together, none left in a collective alone."""
    root = tmp_path / "ckpt"
    reports = [r[f"async-agree:{root}"] for r in run_ranks(2, tmp_path / "out", f"async-agree:{root}")]
    assert reports[0]["seen"][0] == -1 and reports[1]["seen"][0] == 1  # the ranks saw it finish at different steps
    assert reports[0]["failed_at"] == reports[1]["failed_at"] is not None
    for rep in reports:
        assert rep["line"].startswith(f"checkpoint step 1 was not saved in {root}: the file system is full"), rep
    assert not (root / ".tmp-step_00000001").exists() and not (root / "latest").exists()


def test_rank_0_alone_reads_the_checkpoints_at_resume(tmp_path):
    """Resume at 4 ranks from three checkpoints: rank 0 checks ownership and every file's size (its stats grow with
    the files); every other rank touches only what DCP's load reads — ``.metadata`` and the data files holding its
    shards — a count that does not grow with the run's checkpoints or their files."""
    root = tmp_path / "ckpt"
    reports = [r[f"resume-count:{root}"] for r in run_ranks(4, tmp_path / "out", f"resume-count:{root}")]
    files = reports[0]["files"]  # 3 checkpoints x (4 .distcp + .metadata + meta.json)
    assert files == 18
    for r, rep in enumerate(reports):
        assert rep["step"] == 3 and rep["path"] == str(root / "step_00000003") and rep["diff"] == [], (r, rep)
    zero = reports[0]["counts"]
    assert zero["stat"] + zero["scandir"] + zero["listdir"] >= 3, zero  # rank 0 walks the checkpoints
    for r, rep in enumerate(reports[1:], 1):
        c = rep["counts"]
        # DCP's load: .metadata plus the data files this rank's shards are in (its own, rank 0's for replicated
        # entries) — no listing, no meta.json, nothing from the older checkpoints
        assert c["listdir"] == c["scandir"] == 0 and c["stat"] <= 2 and c["open"] <= 4, (r, c)
        assert sum(c.values()) < sum(zero.values()), (r, c, zero)
