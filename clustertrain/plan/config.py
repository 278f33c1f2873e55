"""Project-file sections owned by the planner: ``plan:`` (project level) and ``models[].plan``.
A leaf module: it imports nothing from clustertrain but errors, so project.py can compose it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class PlanConfig(_Strict):
    assumed_mfu: float | None = Field(
        None, gt=0, le=1, description="Model FLOPs utilisation assumed for time estimates. Default: from the catalog's anchors (0.40 on H100-class)."
    )


class ModelPlanConfig(_Strict):
    nodes: int | None = Field(None, ge=1, description="Fixed number of nodes for this model (default: allocated by the planner).")
    tokens: int | None = Field(None, ge=1, description="Token budget for planning (default: max_steps x global_batch x seq_len).")
