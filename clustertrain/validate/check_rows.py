"""One row of a validation verdict, shared by the suite and the rules it applies.

A :class:`CheckRow` is what every rule of the suite returns (thresholds, transport, version rules,
storage): job, check, verdict, what was found, what was required and why. ``report.json``
(:class:`~clustertrain.validate.suitedir.SuiteReport`) stores a list of them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from clustertrain.core.schema import StoredModel

Verdict = Literal["pass", "warn", "fail", "not-applicable"]
_RANK = {"not-applicable": 0, "pass": 1, "warn": 2, "fail": 3}


class CheckRow(StoredModel):
    job: str = Field(description="Suite job (smoke, gpu-efa, collectives, storage-K).")
    check: str = Field(description="What was checked.")
    verdict: Verdict = Field(description="pass / warn / fail / not-applicable.")
    found: str = Field(default="", description="What the job measured or saw.")
    threshold: str = Field(default="", description="What is required (from thresholds.yaml / requirements.yaml).")
    detail: str = Field(default="", description="Why this verdict.")


def worst(verdicts: list[str]) -> Verdict:
    return max(verdicts, key=_RANK.__getitem__, default="not-applicable")  # type: ignore[return-value]
