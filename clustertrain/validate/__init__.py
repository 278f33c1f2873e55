"""Cluster validation stage: environment scans, collectives benchmark, storage benchmark, and parsers
for the output of nccl-tests, IOR, mdtest and fio.

Public API:
    scan(role, instance_type=None, requirements=None) -> ScanReport
    run_collectives(CollectivesConfig, environ=None) -> CollectiveRun
    run_storage_bench(paths, StorageBenchConfig) -> StorageRun
    parse_output(text) -> CollectiveRun | StorageRun   (tool detected from the content)
    transport_rows(nccl_logs, backend=, efa_expected=, instance_type=) -> [CheckRow]  (the transport verdict)
    parse_nccl_tests, detect_transport, nccl_processes, parse_ior, parse_mdtest, parse_fio_json,
    parse_nvidia_smi_csv, parse_fi_info, parse_size, bus_factor

The suite as Slurm jobs is :mod:`clustertrain.validate.suite` (``run_suite``, ``plan_suite``, ``SuiteConfig``,
``SuiteReport``), one unit per check in :mod:`clustertrain.validate.suite_checks`; it is not imported here, so
that the job-side commands (``validate scan/collectives/storage`` on compute nodes) do not load the launch stage.
"""

from clustertrain.validate.collectives import CollectivesConfig, job_env, run_collectives
from clustertrain.validate.nccltests import parse_nccl_tests
from clustertrain.validate.output import detect_tool, parse_output, parse_output_file
from clustertrain.validate.probes import parse_fi_info, parse_nvidia_smi_csv, parse_version, version_at_least
from clustertrain.validate.results import (
    ALL_OPS,
    CollectiveReport,
    CollectiveRow,
    CollectiveRun,
    StorageResult,
    StorageRun,
    ValidateError,
    bus_factor,
    collectives_csv,
    collectives_table,
    parse_size,
    storage_table,
)
from clustertrain.validate.scan import CheckResult, RequirementsConfig, ScanReport, load_requirements, scan, scan_table
from clustertrain.validate.storagebench import StorageBenchConfig, run_storage_bench
from clustertrain.validate.storageparse import parse_fio_json, parse_ior, parse_mdtest
from clustertrain.validate.transport import detect_transport, nccl_processes, transport_rows

__all__ = [
    "ALL_OPS", "CheckResult", "CollectiveReport", "CollectiveRow", "CollectiveRun", "CollectivesConfig",
    "RequirementsConfig", "ScanReport", "StorageBenchConfig", "StorageResult", "StorageRun", "ValidateError",
    "bus_factor", "collectives_csv", "collectives_table", "detect_tool", "detect_transport", "job_env",
    "load_requirements", "nccl_processes", "parse_fi_info", "parse_fio_json", "parse_ior", "parse_mdtest", "parse_nccl_tests",
    "parse_nvidia_smi_csv", "parse_output", "parse_output_file", "parse_size", "parse_version", "run_collectives",
    "run_storage_bench", "scan", "scan_table", "storage_table", "transport_rows", "version_at_least",
]
