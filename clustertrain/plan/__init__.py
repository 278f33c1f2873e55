"""Plan stage: the arithmetic of a project file — instance catalog, memory per GPU, time and cost,
allocation of a cluster's nodes across models — and what is wrong with it.

Public API (loaded lazily: project.py imports ``clustertrain.plan.config`` while it is itself
being imported, so this package must not import project-dependent modules eagerly):
``make_plan``, ``Plan``, ``ModelPlan``, ``ClusterTotals``, ``render_plan``, ``calibrate``,
``Calibration``, ``load_catalog``, ``Instance``, ``ModelShape``, ``Layout``, ``MemoryEstimate``,
``estimate_memory``, ``ModelSpec``, ``Hardware``, ``evaluate``, ``allocate``.
"""

from __future__ import annotations

import importlib

_WHERE = {
    "make_plan": "plan", "Plan": "plan", "ModelPlan": "plan", "ClusterTotals": "plan",
    "render_plan": "render", "calibrate": "calibrate", "Calibration": "calibrate",
    "load_catalog": "catalog", "Instance": "catalog", "ModelShape": "shape",
    "Layout": "memory", "MemoryEstimate": "memory", "estimate_memory": "memory",
    "ModelSpec": "allocate", "Hardware": "allocate", "evaluate": "allocate", "allocate": "allocate",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(f"clustertrain.plan.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'clustertrain.plan' has no attribute {name!r}")
