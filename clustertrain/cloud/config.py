"""Project-file section owned by the cloud stage: ``aws:`` (ParallelCluster, infrastructure).
A leaf module: it imports nothing from clustertrain but errors, so project.py can compose it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class AwsConfig(_Strict):
    region: str = Field(..., description="AWS region, e.g. `ap-southeast-3`.")
