"""aws-parallelcluster's own offline validators, run on a config its schema has loaded.

``pcluster validate`` (``Resource.validate``) runs every validator, and many of them call AWS
(describe subnets, instance types, capacity reservations). The ones listed in :data:`PURE` make no
AWS call: they read only the loaded config. We call them with the arguments ParallelCluster's own
``_register_validators`` passes (``pcluster/config/cluster_config.py`` 3.16.1) rather than
re-writing them; each result becomes a :class:`~clustertrain.core.findings.Finding` at the YAML path it
is about, with ``source="aws-parallelcluster"``.

Not run (they need AWS): ``PlacementGroupCapacityReservationValidator`` (a placement group beside a
targeted ODCR: warning of insufficient capacity), ``EfaValidator``, ``EfaSecurityGroupValidator``,
instance-type and capacity-reservation look-ups. Where we know the answer offline, clustertrain's
rules give it with pcluster's semantics (rules.py, "reserved capacity").

Results we drop on purpose are in :data:`DROPPED` with the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from clustertrain.core.findings import Finding

#: validator class name -> what it checks (the ones called here; all in pcluster/validators/*.py)
PURE = {
    "ComputeResourceSizeValidator": "MinCount <= MaxCount; a Capacity Block needs MinCount = MaxCount > 0",
    "EfaPlacementGroupValidator": "EFA compute resources: placement group explicit (warning when disabled outside a Capacity Block)",
    "PlacementGroupCapacityTypeValidator": "no placement group with a Capacity Block (warning)",
    "NameValidator": "queue and compute resource names",
    "FsxStorageCapacityValidator": "FSx for Lustre capacity steps per deployment type",
    "FsxStorageTypeOptionsValidator": "FSx for Lustre throughput per storage type",
    "FsxPersistentOptionsValidator": "FSx for Lustre throughput only (and always) for PERSISTENT types",
    "DuplicateMountDirValidator": "one mount dir per shared storage; none equal to an EphemeralVolume",
    "OverlappingMountDirValidator": "no shared mount dir inside another (or inside an EphemeralVolume)",
    "NumberOfStorageValidator": "at most 1 new and 20 existing FSx, at most 5 EBS (MAX_NEW_STORAGE_COUNT, "
                                "MAX_EXISTING_STORAGE_COUNT, MAX_EBS_COUNT in pcluster/constants.py)",
}

#: (validator, message start) -> why clustertrain drops the result
DROPPED = {
    ("EfaPlacementGroupValidator", "Placement group is disabled for queue"):
        "only for a queue that targets a capacity reservation: the message itself says this is expected there, and "
        "pcluster's PlacementGroupCapacityReservationValidator warns the other way (insufficient capacity) when one is set",
}


def _run(cls_name: str, module: str, **kwargs: Any) -> list[tuple[str, str, str]]:
    """(level, message, validator) for each failure of one pcluster validator."""
    import importlib

    cls = getattr(importlib.import_module(f"pcluster.validators.{module}"), cls_name)
    out = []
    for failure in cls().execute(**kwargs):
        level = failure.level.name
        if level in ("ERROR", "WARNING"):
            out.append((level.lower(), " ".join(str(failure.message).split()), cls_name))
    return out


def _queues(loaded: Any, raw: dict) -> Iterator[tuple[int, Any, dict]]:
    raw_queues = (raw.get("Scheduling") or {}).get("SlurmQueues") or []
    for i, q in enumerate(getattr(loaded.scheduling, "queues", None) or []):
        yield i, q, raw_queues[i] if i < len(raw_queues) and isinstance(raw_queues[i], dict) else {}


def validator_findings(loaded: Any, raw: dict[str, Any]) -> list[Finding]:
    """Run :data:`PURE` on ``loaded`` (``ClusterSchema().load(raw)``); paths point into ``raw``."""
    found: list[tuple[str, str, str, str]] = []  # (level, path, message, validator)

    def add(path: str, results: list[tuple[str, str, str]], keep: Callable[[str, str], bool] = lambda v, m: True) -> None:
        found.extend((lvl, path, msg, v) for lvl, msg, v in results if keep(v, msg))

    for i, q, rq in _queues(loaded, raw):
        base = f"Scheduling.SlurmQueues[{i}]"
        add(f"{base}.Name", _run("NameValidator", "cluster_validators", name=q.name))
        single_az = len(q.networking.subnet_ids or []) <= 1  # more subnets may be more AZs: pcluster asks AWS
        for j, cr in enumerate(q.compute_resources):
            rp = f"{base}.ComputeResources[{j}]"
            add(f"{rp}.Name", _run("NameValidator", "cluster_validators", name=cr.name))
            add(f"{rp}.MinCount", _run("ComputeResourceSizeValidator", "cluster_validators",
                                       min_count=cr.min_count, max_count=cr.max_count, capacity_type=q.capacity_type))
            pg = q.get_placement_group_settings_for_compute_resource(cr)
            reserved = bool(cr.capacity_reservation_target or q.capacity_reservation_target)
            if single_az:
                add(f"{base}.Networking.PlacementGroup.Enabled", _run(
                    "EfaPlacementGroupValidator", "cluster_validators", efa_enabled=cr.efa.enabled, placement_group_key=pg.get("key"),
                    placement_group_disabled=q.get_chosen_placement_group_setting_for_compute_resource(cr).enabled is False,
                    multi_az_enabled=False, capacity_type=q.capacity_type, queue_name=q.name),
                    keep=lambda v, m, reserved=reserved: not (reserved and _dropped(v, m)))
            add(f"{base}.Networking.PlacementGroup.Enabled", _run(
                "PlacementGroupCapacityTypeValidator", "ec2_validators", capacity_type=q.capacity_type,
                placement_group_enabled=q.is_placement_group_enabled_for_compute_resource(cr)))

    shared = list(getattr(loaded, "shared_storage", None) or [])
    for k, s in enumerate(shared):
        if type(s).__name__ != "SharedFsxLustre":
            continue
        sp = f"SharedStorage[{k}].FsxLustreSettings"
        add(f"{sp}.StorageCapacity", _run(
            "FsxStorageCapacityValidator", "fsx_validators", storage_capacity=s.storage_capacity, deployment_type=s.deployment_type,
            fsx_storage_type=s.fsx_storage_type, per_unit_storage_throughput=s.per_unit_storage_throughput,
            file_system_id=s.file_system_id, backup_id=s.backup_id))
        if not s.file_system_id:
            add(f"{sp}.PerUnitStorageThroughput", _run(
                "FsxPersistentOptionsValidator", "fsx_validators", deployment_type=s.deployment_type, kms_key_id=s.kms_key_id,
                per_unit_storage_throughput=s.per_unit_storage_throughput))
            add(f"{sp}.PerUnitStorageThroughput", _run(
                "FsxStorageTypeOptionsValidator", "fsx_validators", fsx_storage_type=s.fsx_storage_type,
                deployment_type=s.deployment_type, per_unit_storage_throughput=s.per_unit_storage_throughput,
                drive_cache_type=getattr(s, "drive_cache_type", None)))
    if shared:
        local: dict[str, set[str]] = {}
        for _, q, _rq in _queues(loaded, raw):
            eph = getattr(getattr(getattr(q, "compute_settings", None), "local_storage", None), "ephemeral_volume", None)
            if eph is not None and getattr(eph, "mount_dir", None):
                local.setdefault(eph.mount_dir, set()).update(t for cr in q.compute_resources for t in cr.instance_types)
        add("SharedStorage", _run("DuplicateMountDirValidator", "cluster_validators",
                                  shared_storage_name_mount_dir_tuple_list=[(s.name, s.mount_dir) for s in shared],
                                  local_mount_dir_instance_types_dict=local))
        add("SharedStorage", _run("OverlappingMountDirValidator", "cluster_validators",
                                  shared_mount_dir_list=[s.mount_dir for s in shared], local_mount_dir_list=list(local)))
        add("SharedStorage", _storage_counts(shared))

    return [Finding(lvl, path, msg.rstrip("."), _fix(v, msg), source=f"aws-parallelcluster {v}") for lvl, path, msg, v in found]


def _storage_counts(shared: list[Any]) -> list[tuple[str, str, str]]:
    """NumberOfStorageValidator as ``_validate_max_storage_count`` registers it, for FSx for Lustre (new: no
    FileSystemId; existing) and EBS, with pcluster's own limits."""
    from pcluster.constants import MAX_EBS_COUNT, MAX_EXISTING_STORAGE_COUNT, MAX_NEW_STORAGE_COUNT

    fsx = [s for s in shared if type(s).__name__ == "SharedFsxLustre"]
    new = sum(1 for s in fsx if not s.file_system_id)
    out = _run("NumberOfStorageValidator", "cluster_validators", storage_type="new FSx",
               max_number=MAX_NEW_STORAGE_COUNT["fsx"], storage_count=new)
    out += _run("NumberOfStorageValidator", "cluster_validators", storage_type="existing FSx",
                max_number=MAX_EXISTING_STORAGE_COUNT["fsx"], storage_count=len(fsx) - new)
    return out + _run("NumberOfStorageValidator", "cluster_validators", storage_type="EBS", max_number=MAX_EBS_COUNT,
                      storage_count=sum(1 for s in shared if type(s).__name__ == "SharedEbs"))


def _dropped(validator: str, message: str) -> bool:
    return any(v == validator and message.startswith(start) for v, start in DROPPED)


FIXES = {
    "ComputeResourceSizeValidator": "set MinCount <= MaxCount; with a Capacity Block MinCount = MaxCount > 0 (static nodes)",
    "PlacementGroupCapacityTypeValidator": "set Networking.PlacementGroup.Enabled: false",
    "EfaPlacementGroupValidator": "set Networking.PlacementGroup.Enabled explicitly",
    "NumberOfStorageValidator": "create the other file systems outside the cluster (clustertrain's infrastructure stack "
                                "creates every aws.fsx entry) and mount them by FileSystemId",
}


def _fix(validator: str, message: str) -> str:
    return FIXES.get(validator, "see the message (ParallelCluster's own validator)")
