"""What a checkpoint holds: the trainer's state as DCP ``Stateful`` objects (the torchtitan pattern).

:func:`app_state` builds the dict that :class:`clustertrain.train.checkpoint.CheckpointManager` saves and
loads with ``torch.distributed.checkpoint`` (DCP); its keys are the top level of the DCP state dict:

``model_optim`` (:class:`ModelOptimState`)
    Parameters and optimizer state by fully qualified name (``blocks.0.attn.wq.weight``,
    ``state.blocks.0.attn.wq.weight.exp_avg``, ``param_groups.blocks.0.attn.wq.weight.lr`` ...), from
    ``get_state_dict(..., flatten_optimizer_state_dict=True)``: the same names for a plain, DDP, FSDP2,
    tensor-parallel (DTensor) or pipelined module (a pipeline stage holds the whole model's names for its
    blocks). Sharded tensors are saved as their local shards with global offsets, so DCP reshards on load: any
    layout can load any other layout's checkpoint. The optimizer's hyper-parameters are kept per parameter
    (checkpoint format 3): per parameter *group* (format 2) each pipeline stage's group lists only its own
    parameters, and DCP keeps one rank's copy of such an object. Format 2 checkpoints (no pipeline) load with
    ``flatten=False``.
``train`` (:class:`TrainState`)
    ``{"step": int, "consumed_samples": int}``. The learning rate is a function of the step (no
    scheduler state); the data position is ``consumed_samples`` whatever the layout.
``rng`` (:class:`RNGState`)
    ``{"rank_<R>": {"cpu": ByteTensor, "cuda": ByteTensor (GPU only)}}`` — every rank's own stream,
    one key per rank. Restored only at an unchanged layout; see below.

What resumes exactly across a layout change (world size, dp, tp, zero stage)
    Parameters, AdamW moments and step counts (bit-exact: DCP copies the saved fp32 values into the new
    shards), the step, the learning rate (from the step) and the data position (step ``n`` reads samples
    ``[n * global_batch, (n + 1) * global_batch)`` in any layout). What does not: the per-rank RNG
    streams (dropout masks) restart from the seed, because rank ``R`` of the new layout is not rank ``R``
    of the old one. At an unchanged layout they are restored too, so the resumed run is bit-identical.
"""

from __future__ import annotations

from typing import Any

import torch

# torch.distributed.checkpoint (0.8 s of imports, torch._dynamo among them) is imported where a state dict is made,
# not at start-up: DCP's ``Stateful`` is a runtime-checkable Protocol (torch/distributed/checkpoint/stateful.py), so
# the classes below are Stateful by their two methods, without inheriting it.


class TrainState:
    """The loop's position: steps trained and samples consumed."""

    def __init__(self, step: int = 0, consumed_samples: int = 0):
        self.step = step
        self.consumed_samples = consumed_samples

    def state_dict(self) -> dict[str, Any]:
        return {"step": int(self.step), "consumed_samples": int(self.consumed_samples)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.step = int(state_dict["step"])
        self.consumed_samples = int(state_dict["consumed_samples"])


class ModelOptimState:
    """A model and its optimizer, by fully qualified parameter names (layout-independent keys). ``flatten``: the
    optimizer's hyper-parameters per parameter (format 3) rather than per parameter group (format 2)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, flatten: bool = True):
        self.model = model
        self.optimizer = optimizer
        self.flatten = flatten

    def _options(self):
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(strict=True, flatten_optimizer_state_dict=self.flatten)

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=self._options())
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_state_dict

        set_state_dict(self.model, self.optimizer, model_state_dict=state_dict["model"],
                       optim_state_dict=state_dict["optim"], options=self._options())


class RNGState:
    """This rank's torch RNG streams (CPU, and the current CUDA device's when there is one)."""

    def __init__(self, rank: int | None = None):
        self.rank = _rank() if rank is None else rank

    @property
    def key(self) -> str:
        return f"rank_{self.rank}"

    def state_dict(self) -> dict[str, Any]:
        mine: dict[str, torch.Tensor] = {"cpu": torch.get_rng_state()}
        if torch.cuda.is_available():
            mine["cuda"] = torch.cuda.get_rng_state()
        return {self.key: mine}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        mine = state_dict[self.key]
        torch.set_rng_state(mine["cpu"])
        if "cuda" in mine and torch.cuda.is_available():
            torch.cuda.set_rng_state(mine["cuda"])


def app_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, train: TrainState, *,
              rng: bool = True) -> dict[str, Any]:
    """The DCP state dict of a run (keys in the module docstring); ``rng=False`` leaves the RNG streams out
    (a resume into another layout)."""
    state: dict[str, Any] = {"model_optim": ModelOptimState(model, optimizer), "train": train}
    if rng:
        state["rng"] = RNGState()
    return state


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
