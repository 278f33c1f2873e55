"""The checks of the validation suite, one small unit each, planned and judged in this order:
:mod:`smoke`, :mod:`gpu_efa`, :mod:`collectives`, :mod:`nccl_tests`, :mod:`storage` (:data:`CHECKS`).

Every unit module has the same shape:

    NAME                                         the check (its job's name, or their prefix: storage-K)
    not_applicable(ctx) -> str | None            why the check does not apply to the project (then no job)
    plan(ctx) -> list[SuiteJob]                  its job(s): nodes, tasks per node, the srun steps, the result
                                                 files they must leave, the config file they read
    gather(job, outcome, nodes, ctx) -> rows     read what one job left in its results directory and judge it
    evaluate_*(...) -> list[CheckRow]            the judgement itself, on recorded results (pure)

``ctx`` is a :class:`~clustertrain.validate.suitejob.SuiteContext`; ``nodes`` the hosts Slurm ran the job on.
"""

from clustertrain.validate.suite_checks import collectives, gpu_efa, nccl_tests, smoke, storage

CHECKS = (smoke, gpu_efa, collectives, nccl_tests, storage)

__all__ = ["CHECKS", "collectives", "gpu_efa", "nccl_tests", "smoke", "storage"]
