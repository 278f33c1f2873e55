"""Pipeline parallelism on real gloo ranks: pp 2 (2 ranks), pp 2 x dp 2 (4 ranks) and dp 2 x tp 2 x pp 2 (8 ranks),
each under the three schedules (gpipe, 1f1b, interleaved 1f1b with 2 virtual stages per rank; at 4 ranks the 1f1b
one with FSDP2 stages, the others DDP; at 8 ranks all FSDP2, the 1f1b one with sequence parallelism), train the DDP
loss curve of the same model, seed and global batch over 12 steps; each layout's checkpoint resumes bit-identically
at that layout, and loads, fully equal, into another (pp 2 -> pp 1, pp 2 x dp 2 -> dp 4, and the 3-D layout ->
fsdp 4 x tp 2); and the per-rank bytes the planner prints (``clustertrain.plan.memory.trainer_state_bytes``) are
every rank's local parameters, gradients and AdamW states. A Llama-style model (rotary positions, grouped-query
attention, no biases; the ``llama-*`` layouts: pp 2 interleaved, pp 2 x fsdp 2, dp 2 x tp 2 x pp 2 with one key/value
head per tp rank) trains its own DDP curve the same way, and every layout's stages hold the whole model's names.

The ranks run this file as a script (``python test_pipeline_layouts.py OUT``, one world size per launch); each
builds every layout of :data:`WORLDS` for its world size through the trainer's ``build_parallel_model``, trains it
with the trainer's optimizer, schedule and ``forward_backward_step``, saves and loads with the trainer's
``CheckpointManager`` and ``app_state``, and rank 0 writes what the ranks saw to ``OUT/result.json``.

Tolerances (fp32 on CPU). A pipelined step computes the same sums as DDP in other orders (micro-batch losses
summed on the last stage, gradients of 4 micro-batches accumulated in a different order, norms summed over the
pipeline group, tensor-parallel partial matmuls): each reordering is worth a few fp32 ulps (~1e-7 relative); over
20 steps (12 since the CI budget tightened) the spread observed was ~2e-7 relative in loss. The tests allow 1e-5
relative — still far below what a real mistake does (a stage fed the wrong micro-batch, a gradient missing its
scale, or a norm taken over one stage changes the loss by > 1e-3 within a few steps). Resumes at the same layout are compared exactly (``==``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.support.ranks import launch_ranks, local_state_bytes


pytestmark = pytest.mark.slow

ARCH = dict(layers=4, hidden=32, heads=2, seq_len=16, vocab=64, mlp="swiglu", norm="rmsnorm", tie_embeddings=False)
#: the layouts named ``llama-*``: rotary positions (no pos_emb on the first stage), grouped-query attention (4 query
#: heads, 2 key/value heads: at tp 2 one per rank), no linear biases
LLAMA = dict(ARCH, heads=4, kv_heads=2, position="rope", bias=False)
STEPS, MICRO = 12, 1
#: each layout saves at RESUME_AT; a fresh copy of the RESUMED one loads that and trains the last 2 steps (compared ==)
RESUME_AT = STEPS - 2
#: per world size: the global batch (8 ranks: 4, so the 3-D layouts run 2 micro-batches per step — half the time
#: of 8 ranks on 2 cores; their DDP reference, "ddp-gb4", runs at 2 ranks)
GLOBAL_BATCH = {2: 8, 4: 8, 8: 4}
SCHEDULES = {"gpipe": {"schedule": "gpipe"}, "1f1b": {"schedule": "1f1b"},
             "interleaved": {"schedule": "interleaved_1f1b", "virtual_stages": 2}}
#: per world size: layout name -> parallelism overrides
WORLDS = {
    2: {"ddp": {}, "ddp-gb4": {}, **{f"pp2-{k}": {"pp": 2, **v} for k, v in SCHEDULES.items()},
        "llama-ddp": {}, "llama-ddp-gb4": {}, "llama-pp2-interleaved": {"pp": 2, **SCHEDULES["interleaved"]}},
    4: {**{f"pp2xdp2-{k}": {"pp": 2, "zero_stage": 3 if k == "1f1b" else 0, **v} for k, v in SCHEDULES.items()},
        "llama-pp2xdp2-1f1b": {"pp": 2, "zero_stage": 3, **SCHEDULES["1f1b"]}},
    8: {**{f"dp2xtp2xpp2-{k}": {"pp": 2, "tp": 2, "zero_stage": 3, "sequence_parallel": k == "1f1b", **v}
           for k, v in SCHEDULES.items()},
        "llama-dp2xtp2xpp2-1f1b": {"pp": 2, "tp": 2, "zero_stage": 3, "sequence_parallel": True, **SCHEDULES["1f1b"]}},
}
#: per world size: the layout whose resume at step RESUME_AT is compared with its uninterrupted run
RESUMED = {2: "pp2-1f1b", 4: "pp2xdp2-1f1b", 8: "dp2xtp2xpp2-1f1b"}
#: per world size: the other layout that loads the RESUMED layout's checkpoint of step RESUME_AT
RESHARD = {2: {}, 4: {"zero_stage": 3}, 8: {"zero_stage": 3, "tp": 2}}


# -- the ranks' side ------------------------------------------------------------------------------
class Run:
    """One layout's model, optimizer and data on this rank."""

    def __init__(self, overrides: dict, world: int, global_batch: int, arch: dict = ARCH):
        import torch

        from clustertrain.train.config import ArchConfig, ParallelismConfig, TrainingConfig
        from clustertrain.core.parallel_layout import resolve_layout
        from clustertrain.train.optim import build_optimizer
        from clustertrain.train.parallel import build_parallel_model
        from clustertrain.train.checkpoint_state import TrainState

        self.arch = ArchConfig(**arch)
        self.layout = resolve_layout(ParallelismConfig(**overrides), world, on_gpu=False)
        self.gb = global_batch
        self.cfg = TrainingConfig(max_steps=STEPS, micro_batch=MICRO, global_batch=global_batch, lr=1e-2, min_lr=1e-3,
                                  warmup_steps=2)
        self.accum = global_batch // (MICRO * self.layout.dp)
        self.pm = build_parallel_model(self.arch, self.arch.vocab, self.layout, torch.device("cpu"), seed=11,
                                       microbatches=self.accum)
        self.optimizer = build_optimizer(self.pm.model, self.cfg)
        self.state = TrainState()
        gen = torch.Generator().manual_seed(5)  # learnable sequences: start + stride * position (mod vocab)
        start = torch.randint(0, self.arch.vocab, (STEPS * 8, 1), generator=gen)
        stride = torch.randint(1, 4, (STEPS * 8, 1), generator=gen)
        self.data = (start + stride * torch.arange(self.arch.seq_len + 1)) % self.arch.vocab
        self.bytes: dict[str, int] | None = None

    def step(self) -> tuple[float, float]:
        """One optimizer step, as Trainer._train_step; (loss of the step summed over dp ranks / dp, grad norm)."""
        import torch.distributed as dist

        from clustertrain.train.optim import lr_at, set_lr

        step, dp_rank = self.state.step, self.layout.dp_rank(dist.get_rank())
        batches = []
        for micro in range(self.accum):
            start = step * self.gb + (dp_rank * self.accum + micro) * MICRO
            batch = self.data[start:start + MICRO]
            batches.append((batch[:, :-1], batch[:, 1:]))
        loss = self.pm.forward_backward_step(batches, 1.0 / self.accum)
        norm = self.pm.clip_grad_norm_(1.0)
        set_lr(self.optimizer, lr_at(step, self.cfg))
        self.optimizer.step()
        if self.bytes is None:  # AdamW creates its state at the first step: count after it, gradients still held
            self.bytes = local_state_bytes(self.pm.model, self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        self.state.step += 1
        dist.all_reduce(loss)  # every rank holds its dp rank's loss: the mean over ranks is the step's loss
        return float(loss) / dist.get_world_size(), float(norm)

    def manager(self, root: Path):
        import torch.distributed as dist

        from clustertrain.train.checkpoint import CheckpointManager

        return CheckpointManager(root, 5, "f" * 16, "p", "m", dist.get_rank(), dist.get_world_size(),
                                 layout=self.layout.to_dict())

    def app_state(self):
        from clustertrain.train.checkpoint_state import app_state

        return app_state(self.pm.model, self.optimizer, self.state)

    def full_state(self) -> dict[str, list[float]]:
        """Every parameter and AdamW moment of the whole model, unsharded, by name (gathered from all stages): on
        rank 0, the one that writes the result; the other ranks get ``{}``."""
        import torch.distributed as dist

        mine = {}
        for name, p in self.pm.model.named_parameters():
            for key, t in [(name, p), *((f"{name}.{k}", v) for k, v in self.optimizer.state[p].items() if k != "step")]:
                full = t.full_tensor() if hasattr(t, "full_tensor") else t
                mine[key] = full.detach().flatten().tolist()
        gathered: list[dict | None] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
        dist.gather_object(mine, gathered, dst=0)
        return {k: v for part in gathered or [] for k, v in part.items()}


def world_result(out: Path) -> dict:
    import torch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    result: dict = {"layouts": {}}
    for name, overrides in WORLDS[world].items():
        run = Run(overrides, world, 4 if name.endswith("ddp-gb4") else GLOBAL_BATCH[world], arch_of(name))
        losses, norms = [], []
        for step in range(STEPS):
            loss, norm = run.step()
            losses.append(loss)
            norms.append(norm)
            if step + 1 == RESUME_AT:
                run.manager(out / name).save(RESUME_AT, RESUME_AT * run.gb, run.app_state())
        every_rank: list[dict | None] = [None] * world
        dist.all_gather_object(every_rank, run.bytes)
        names: list[list[str] | None] = [None] * world  # the parameter names each rank's stages hold
        dist.all_gather_object(names, sorted(fqn for fqn, _ in run.pm.model.named_parameters()))
        result["layouts"][name] = {"losses": losses, "norms": norms, "layout": run.layout.to_dict(), "bytes": every_rank,
                                   "names": names, "final": run.full_state() if name == RESUMED[world] else None}
        if name != RESUMED[world]:
            continue
        resumed = Run(overrides, world, GLOBAL_BATCH[world])  # the same layout, fresh: load step RESUME_AT, train to STEPS
        loaded = resumed.manager(out / name).load_latest(resumed.app_state())
        assert loaded is not None and resumed.state.step == RESUME_AT
        source = resumed.full_state()  # the checkpoint as loaded at its own layout: what RESHARD[world] must load
        result["layouts"][name]["resumed_losses"] = [resumed.step()[0] for _ in range(STEPS - RESUME_AT)]
        result["layouts"][name]["resumed_final"] = resumed.full_state()
        target = Run(RESHARD[world], world, GLOBAL_BATCH[world])
        meta = target.manager(out / name).load_latest(target.app_state()).meta
        result["reshard"] = {"from": name, "saved_layout": meta.layout, "to": target.layout.to_dict(),
                             "step": target.state.step, "source": source, "target": target.full_state(),
                             # the next step from the saved layout is the resumed run's first one
                             "next_loss": [target.step()[0], result["layouts"][name]["resumed_losses"][0]]}
    if rank == 0:
        (out / "result.json").write_text(json.dumps(result))
    return result


def worker(out: Path) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    world_result(out)
    dist.barrier()
    dist.destroy_process_group()


# -- the test's side ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def worlds(tmp_path_factory) -> dict[int, dict]:
    return {w: launch_ranks(__file__, tmp_path_factory.mktemp(f"pp{w}"), w) for w in WORLDS}


@pytest.fixture(params=list(WORLDS), ids=lambda w: f"{w}-ranks")
def world(request, worlds) -> dict:
    return worlds[request.param]


def arch_of(name: str) -> dict:
    return LLAMA if name.startswith("llama-") else ARCH


def reference(worlds: dict, world: dict, name: str) -> dict:
    """DDP over 2 ranks at ``world``'s global batch: the same model (classic or ``llama-``), seed and data."""
    gb = GLOBAL_BATCH[world["layouts"][name]["layout"]["world"]]
    prefix = "llama-" if name.startswith("llama-") else ""
    return worlds[2]["layouts"][prefix + ("ddp" if gb == 8 else f"ddp-gb{gb}")]


def pipelined(world: dict) -> list[str]:
    return [name for name in world["layouts"] if not name.removeprefix("llama-").startswith("ddp")]


def test_every_schedule_trains_the_ddp_loss_curve(worlds, world):
    for name in pipelined(world):
        ddp = reference(worlds, world, name)
        assert ddp["losses"][-1] < ddp["losses"][0] - 0.5  # it learns: the comparison is not of two flat lines
        run = world["layouts"][name]
        assert run["layout"]["pp"] > 1, name
        assert run["losses"] == pytest.approx(ddp["losses"], rel=1e-5), name
        # the clipped norm is the whole model's: one stage's alone would be ~1/sqrt(2) of it
        assert run["norms"] == pytest.approx(ddp["norms"], rel=1e-4), name


def test_a_resume_at_the_same_layout_is_bit_identical(world):
    [name] = [name for name, run in world["layouts"].items() if "resumed_losses" in run]
    run = world["layouts"][name]
    assert len(run["resumed_losses"]) == STEPS - RESUME_AT
    assert run["resumed_losses"] == run["losses"][RESUME_AT:], name
    assert run["resumed_final"] == run["final"], name


def test_a_pipelined_checkpoint_loads_fully_equal_into_another_layout(world):
    reshard = world["reshard"]
    saved, loaded = reshard["saved_layout"], reshard["to"]
    assert saved["pp"] == 2 and (loaded["pp"], loaded["dp"], loaded["tp"]) != (saved["pp"], saved["dp"], saved["tp"])
    assert reshard["step"] == RESUME_AT
    assert reshard["target"].keys() == reshard["source"].keys()
    assert any(k.endswith("exp_avg_sq") for k in reshard["target"])  # the AdamW moments travel too
    assert reshard["target"] == reshard["source"]  # every parameter and moment, exactly
    # and both go on to train the same next step
    assert reshard["next_loss"][0] == pytest.approx(reshard["next_loss"][1], rel=1e-5)


def test_the_stages_hold_the_whole_models_names(world):
    """Every rank's stages hold names of the whole model (the checkpoint's keys), and together all of them: the
    planner's tensor list; a Llama-style first stage holds no pos_emb, its blocks no biases."""
    from clustertrain.core.model_shape import ModelShape, parameter_tensors
    from clustertrain.train.config import ArchConfig

    for name, run in world["layouts"].items():
        arch = ArchConfig(**arch_of(name))
        planned = {t.name for t in parameter_tensors(ModelShape.from_arch(arch, arch.vocab))}
        held = [set(n) for n in run["names"]]
        assert set().union(*held) == planned, name
        if run["layout"]["pp"] > 1:
            assert all(h < planned for h in held), name  # each rank a part: the stages differ
        if name.startswith("llama-"):
            assert "tok_emb.weight" in planned and "pos_emb.weight" not in planned
            assert not any(n.endswith(".bias") for n in planned)


def test_planner_bytes_equal_every_ranks_local_stage(world):
    from clustertrain.plan.memory import trainer_state_bytes
    from clustertrain.core.model_shape import ModelShape
    from clustertrain.train.config import ArchConfig
    from clustertrain.core.parallel_layout import ParallelLayout

    for name, run in world["layouts"].items():
        arch = ArchConfig(**arch_of(name))
        shape = ModelShape.from_arch(arch, arch.vocab)
        layout = ParallelLayout(**run["layout"])
        sizes = {(b["params"], b["grads"], b["optimizer"]) for b in run["bytes"]}
        if layout.pp > 1:
            assert len(sizes) > 1, name  # the stages hold different parts: the comparison is per rank
        for rank, held in enumerate(run["bytes"]):
            planned = trainer_state_bytes(shape, layout, rank)
            assert (planned.params, planned.grads, planned.optimizer) == \
                (held["params"], held["grads"], held["optimizer"]), (name, rank)


if __name__ == "__main__":
    worker(Path(sys.argv[1]))
