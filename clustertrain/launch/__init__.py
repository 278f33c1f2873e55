"""Launch stage: backends behind one interface (local processes, Slurm jobs), run preparation,
rank environments and the local Slurm cluster for rehearsal and tests.

Public API (imported lazily, so that light commands do not pay for torch):
:func:`prepare_run`, :class:`RunSpec`, :class:`LocalLauncher`, :func:`run_project`,
:class:`JobStatus`, :class:`Launcher`, :class:`SlurmLauncher`, :func:`submit_project`,
:class:`LaunchConfig`, :class:`LocalSlurmCluster`, :func:`query_job`, :func:`newest_jobs` (each run's newest job); for a script rendered elsewhere
(the validation suite's jobs): :func:`submit_script`, :func:`batch_state`, :func:`cancel_job`.
"""

from clustertrain.core.lazy import lazy_exports

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
    "newest_jobs": "clustertrain.launch.overview",
    "submit_script": "clustertrain.launch.batch",
    "batch_state": "clustertrain.launch.batch",
    "cancel_job": "clustertrain.launch.batch",
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _PUBLIC)
