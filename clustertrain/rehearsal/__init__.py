"""``clustertrain rehearse``: a project's whole submission on an emulated copy of its ParallelCluster, on one machine.

Modules: :mod:`~.shape` (the cluster from the generated ParallelCluster config), :mod:`~.cluster` (Slurm with one
mount namespace per node), :mod:`~.boot` (a node's boot in ParallelCluster's phase order), :mod:`~.jobs` (each
model's real batch script with the payload as rank command), :mod:`~.payload` (what each rank runs),
:mod:`~.checks` and :mod:`~.report`, and :mod:`~.run` (the whole rehearsal: :func:`rehearse`).

This package's ``__init__`` imports nothing: the boot driver and the payload start hundreds of times.
"""
