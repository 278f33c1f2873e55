"""The infrastructure stack's FSx for Lustre file systems at ``infra delete``.

They have ``DeletionPolicy: RetainExceptOnCreate`` (clustertrain.cloud.infra): no deploy or delete of the stack drops
the data they hold. But a file system keeps its network interfaces in the stack's private subnet, carrying the stack's
``FsxSecurityGroup``, and EC2 deletes neither a subnet nor a security group that a network interface still uses
(``DependencyViolation``). A stack delete while they exist therefore ends DELETE_FAILED halfway, with the NAT
gateway and routes gone and the VPC, subnet and group left. So ``infra delete`` looks first (:func:`live`): while
one exists it refuses in one line, and ``--delete-file-systems`` deletes them (FSx ``DeleteFileSystem``; for Lustre
no final backup is taken unless asked) and waits until FSx no longer lists them before it deletes the stack.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from clustertrain.cloud.stack import aws_errors
from clustertrain.core.errors import CloudError

if TYPE_CHECKING:
    from clustertrain.cloud.stack import StackReport

FSX_TYPE = "AWS::FSx::FileSystem"


@dataclass(frozen=True)
class LiveFileSystem:
    logical_id: str
    file_system_id: str
    lifecycle: str       # FSx's Lifecycle: AVAILABLE, CREATING, DELETING, ...
    capacity_gb: int


def live(retained: list[tuple[str, str, str]], region: str, fsx: Any = None) -> list[LiveFileSystem]:
    """The retained file systems of a stack (``StackReport.retained``) that FSx still lists."""
    ids = {physical: logical for logical, rtype, physical in retained if rtype == FSX_TYPE and physical}
    if not ids:
        return []
    fsx = fsx or _client(region)
    found = []
    for fs_id, logical in ids.items():
        with aws_errors(f"describe file system {fs_id}"):
            try:
                systems = fsx.describe_file_systems(FileSystemIds=[fs_id])["FileSystems"]
            except fsx.exceptions.FileSystemNotFound:
                continue
        found += [LiveFileSystem(logical, fs_id, s.get("Lifecycle", ""), int(s.get("StorageCapacity", 0))) for s in systems]
    return found


@dataclass
class Teardown:
    """What ``infra delete`` does about a stack's kept resources: the file systems it deletes first, and what stays
    (``(logical id, type, physical id)``; the file systems are deleted or already gone, never kept)."""

    report: "StackReport"
    file_systems: list[LiveFileSystem]
    kept: list[tuple[str, str, str]]

    def summary(self) -> str:
        r = self.report
        first = (f"; the FSx file systems {', '.join(sorted(s.file_system_id for s in self.file_systems))} and their data "
                 "first") if self.file_systems else ""
        kept = ", ".join(f"{physical or logical} ({rtype})" for logical, rtype, physical in self.kept) or "nothing"
        return (f"stack {r.stack_name} in {r.region} ({(r.stack or {}).get('StackStatus')}, {r.resources} resources) will be "
                f"deleted{first}; retained: {kept}")


def plan_teardown(report: "StackReport", delete_file_systems: bool, delete_command: str, fsx: Any = None) -> Teardown:
    """The :class:`Teardown` of the stack ``report`` describes. While its file systems exist and
    ``delete_file_systems`` is not given, one CloudError line: the stack delete would fail on them."""
    systems = live(report.retained, report.region, fsx)
    if systems and not delete_file_systems:
        names = ", ".join(f"{s.logical_id} {s.file_system_id} ({s.capacity_gb} GiB)" for s in systems)
        raise CloudError(f"stack {report.stack_name} still has its FSx file systems {names} (kept by a stack delete): their "
                         "network interfaces keep the private subnet and the FSx security group in use, so the stack delete "
                         f"would fail halfway; copy off what you need, then run `{delete_command} --delete-file-systems` (it "
                         "deletes them first); nothing was deleted")
    return Teardown(report, systems, [r for r in report.retained if r[1] != FSX_TYPE])


def delete_all(systems: list[LiveFileSystem], region: str, echo: Callable[[str], None] = print, poll_s: float = 15.0,
               timeout_s: float = 3600.0, fsx: Any = None) -> None:
    """Delete each file system and wait until FSx lists none of them (a Lustre delete takes minutes)."""
    fsx = fsx or _client(region)
    for s in systems:
        if s.lifecycle != "DELETING":
            with aws_errors(f"delete file system {s.file_system_id}"):
                fsx.delete_file_system(FileSystemId=s.file_system_id)
        echo(f"deleting FSx {s.file_system_id} ({s.logical_id})")
    deadline = time.monotonic() + timeout_s
    left = list(systems)
    while left:
        left = live([(s.logical_id, FSX_TYPE, s.file_system_id) for s in left], region, fsx)
        failed = [s for s in left if s.lifecycle == "FAILED"]
        if failed:
            raise CloudError(f"FSx could not delete {', '.join(s.file_system_id for s in failed)} (Lifecycle FAILED); see "
                             "`aws fsx describe-file-systems` for its FailureDetails, then run infra delete again")
        if not left:
            break
        if time.monotonic() > deadline:
            raise CloudError(f"FSx is still deleting {', '.join(s.file_system_id for s in left)} after {timeout_s:.0f} s; run "
                             "infra delete again once `aws fsx describe-file-systems` no longer lists them")
        time.sleep(poll_s)
    echo(f"deleted {len(systems)} FSx file system(s)")


def _client(region: str) -> Any:
    import boto3

    return boto3.client("fsx", region_name=region)
