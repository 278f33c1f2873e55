"""Plan stage: the arithmetic of a project file — instance catalog, memory per GPU, time and cost,
allocation of a cluster's nodes across models — and what is wrong with it.

Public API (loaded lazily: project.py imports ``clustertrain.plan.config`` while it is itself
being imported, so this package must not import project-dependent modules eagerly):
``make_plan``, ``Plan``, ``ModelPlan``, ``ClusterTotals``, ``render_plan``, ``Calibration``,
``load_catalog``, ``Instance``, ``ModelShape``, ``parameter_tensors``, ``MemoryEstimate``, ``estimate_memory``,
``trainer_state_bytes``, ``estimate_megatron_memory`` (a Megatron-LM model's), ``ModelSpec``, ``Hardware``, ``evaluate``.

The functions ``calibrate`` and ``allocate`` share their module's name: import them from
``clustertrain.plan.calibrate`` and ``clustertrain.plan.allocate`` (as a package attribute, the
submodule would shadow the function as soon as anything imported it).
"""

from __future__ import annotations

from clustertrain.core.lazy import lazy_exports

_PUBLIC = {
    "make_plan": "clustertrain.plan.plan",
    "Plan": "clustertrain.plan.plan",
    "ModelPlan": "clustertrain.plan.plan",
    "ClusterTotals": "clustertrain.plan.plan",
    "render_plan": "clustertrain.plan.render",
    "Calibration": "clustertrain.plan.calibrate",
    "load_catalog": "clustertrain.plan.catalog",
    "Instance": "clustertrain.plan.catalog",
    "ModelShape": "clustertrain.core.model_shape",
    "parameter_tensors": "clustertrain.core.model_shape",
    "trainer_state_bytes": "clustertrain.plan.memory",
    "MemoryEstimate": "clustertrain.plan.memory",
    "estimate_memory": "clustertrain.plan.memory",
    "estimate_megatron_memory": "clustertrain.plan.megatron_memory",
    "ModelSpec": "clustertrain.plan.allocate",
    "Hardware": "clustertrain.plan.allocate",
    "evaluate": "clustertrain.plan.allocate",
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _PUBLIC)
