"""Train stage: the per-rank entry point and everything it runs (model, parallelism, loop,
checkpoint, metrics, signals). Runs on compute nodes: imports nothing from cloud/, launch/ or cli.

Public API (import from the submodules; this package imports nothing heavy at import time):
``clustertrain.train.entry.main``, ``clustertrain.core.checkpoint_format.find_latest``,
``clustertrain.train.metrics.read_metrics``, ``clustertrain.train.model.GPT``.
"""
