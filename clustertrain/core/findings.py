"""One finding of a check: what every preflight rule returns (``clustertrain check``, ``cluster validate``).

A leaf module: the stages (cloud rules, planner, launch, data, validation) produce findings, and
:mod:`clustertrain.check` gathers them into one table. ``path`` names the field (a project-file key
such as ``storage.runs`` or a ParallelCluster YAML path such as ``Scheduling.SlurmQueues[0]``);
``fix`` says what to do; ``source`` names who found it (``clustertrain``, ``aws-parallelcluster``...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Level = Literal["error", "warning"]


@dataclass(frozen=True)
class Finding:
    level: Level
    path: str
    message: str
    fix: str
    source: str = "clustertrain"

    def __str__(self) -> str:
        return f"{self.level}: {self.path}: {self.message}; fix: {self.fix}"
