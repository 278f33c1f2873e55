"""Launch stage: backends behind one interface (local processes, Slurm jobs), run preparation,
rank environments and the local Slurm cluster for rehearsal and tests.

Public API (imported lazily, so that light commands do not pay for torch):
:func:`prepare_run`, :class:`RunSpec`, :class:`LocalLauncher`, :func:`run_project`,
:class:`JobStatus`, :class:`Launcher`, :class:`SlurmLauncher`, :func:`submit_project`,
:class:`LaunchConfig`, :class:`LocalSlurmCluster`, :func:`query_job`.
"""

from importlib import import_module

_PUBLIC = {
    "JobStatus": "clustertrain.launch.backend",
    "Launcher": "clustertrain.launch.backend",
    "LocalLauncher": "clustertrain.launch.local",
    "RunSpec": "clustertrain.launch.prepare",
    "prepare_run": "clustertrain.launch.prepare",
    "run_project": "clustertrain.launch.run",
    "SlurmLauncher": "clustertrain.launch.slurm",
    "submit_project": "clustertrain.launch.slurm",
    "LaunchConfig": "clustertrain.launch.config",
    "LocalSlurmCluster": "clustertrain.launch.slurm_cluster",
    "query_job": "clustertrain.launch.slurm_query",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(import_module(_PUBLIC[name]), name)
    raise AttributeError(name)
