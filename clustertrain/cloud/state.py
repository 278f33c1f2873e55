"""The infrastructure state file: what ``clustertrain cluster infra deploy`` deployed, beside the project file.

``examples/p5e-80x7.yaml`` -> ``examples/p5e-80x7.infra.json`` (:func:`state_path`). Written atomically (temp file,
fsync, rename) after every successful deploy; removed by ``infra delete`` once the stack is gone. Format (JSON,
version 1; readers ignore keys a newer version adds)::

    {
      "version": 1,
      "project": "p5e-80x7",                 # project name at deploy time
      "stack_name": "p5e-80x7-infra",
      "stack_id": "arn:aws:cloudformation:ap-southeast-3:111122223333:stack/p5e-80x7-infra/...",
      "region": "ap-southeast-3",
      "status": "CREATE_COMPLETE",            # the stack status when the deploy finished
      "updated": "2026-11-23T10:00:00+00:00", # when the deploy finished (UTC)
      "template_sha256": "...",               # of the deployed template body: `infra status` compares the project's
      "outputs": {"VpcId": "vpc-...", "PublicSubnetId": "subnet-...", "PrivateSubnetId": "subnet-...",
                  "HeadNodeSecurityGroupId": "sg-...", "ComputeSecurityGroupId": "sg-...",
                  "DataBucketName": "...", "CheckpointBucketName": "...", "StoragePolicyArn": "arn:aws:iam::...:policy/...",
                  "FsxDataId": "fs-...", ...},   # one Fsx<Name>Id per file system the stack creates (fsx_output)
      "retained": ["DataBucket", "CheckpointBucket", "FsxData", ...]   # kept by a stack delete (DeletionPolicy Retain*)
    }

No secret is ever in it: ids, names and ARNs only.

:func:`apply_state` is how the cluster config reads the deployed outputs instead of hand-copied ids: every project
field of :data:`OUTPUT_FIELDS` the project file leaves out is filled from ``outputs`` (``load_project`` calls it); a
field the file sets itself is kept, and ``clustertrain check`` reports a value that differs from the stack's
(:func:`state_findings`). The FSx for Lustre file systems the stack creates (every ``aws.fsx`` entry without a
``file_system_id``: ParallelCluster itself creates at most one) are mounted by the id of their output
(:func:`fsx_output`, :func:`deployed_fsx_id`); the project entry is left as written, so the template keeps creating
them. Nothing here calls AWS.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clustertrain.core.errors import ConfigError
from clustertrain.core.findings import Finding

if TYPE_CHECKING:
    from clustertrain.cloud.config import AwsConfig
    from clustertrain.project import Project

STATE_VERSION = 1
STATE_SUFFIX = ".infra.json"

#: stack output -> (project field, attribute path below ``aws``)
OUTPUT_FIELDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "PublicSubnetId": ("aws.network.public_subnet_id", ("network", "public_subnet_id")),
    "PrivateSubnetId": ("aws.network.private_subnet_id", ("network", "private_subnet_id")),
    "HeadNodeSecurityGroupId": ("aws.network.head_security_group_id", ("network", "head_security_group_id")),
    "ComputeSecurityGroupId": ("aws.network.compute_security_group_id", ("network", "compute_security_group_id")),
    "StoragePolicyArn": ("aws.storage_policy_arn", ("storage_policy_arn",)),
}


def fsx_logical_id(name: str) -> str:
    """The template's logical id of the file system ``name`` (``aws.fsx[].name``): ``fsx-data`` -> ``FsxData``
    (a leading ``fsx`` word is not repeated), ``scratch_2`` -> ``FsxScratch2``."""
    words = [w for w in re.split(r"[-_]+", name) if w]
    if len(words) > 1 and words[0].lower() == "fsx":
        words = words[1:]
    return "Fsx" + "".join(w[:1].upper() + w[1:] for w in words)


def fsx_output(name: str) -> str:
    """The stack output holding the id of the file system ``name``: ``fsx-data`` -> ``FsxDataId``."""
    return fsx_logical_id(name) + "Id"


def deployed_fsx_id(project: "Project", name: str) -> str | None:
    """The id the deployed stack gave the file system ``name`` (from the state file, same region only), else None."""
    state, aws = project.infra_state, project.aws
    if state is None or aws is None or state.region != aws.region:
        return None
    return state.outputs.get(fsx_output(name)) or None


@dataclass
class InfraState:
    stack_name: str
    stack_id: str
    region: str
    status: str
    outputs: dict[str, str]
    project: str = ""
    updated: str = ""
    template_sha256: str = ""
    retained: list[str] = field(default_factory=list)
    version: int = STATE_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=False) + "\n"


def state_path(project_file: Path) -> Path:
    """``dir/NAME.yaml`` -> ``dir/NAME.infra.json``."""
    project_file = Path(project_file)
    return project_file.with_name(project_file.stem + STATE_SUFFIX)


def project_state_path(project: "Project") -> Path | None:
    """Where the project's state is (or would be) kept: ``NAME.infra.json`` beside its file (None: no file)."""
    return state_path(project.file) if project.file is not None else None


def attach_state(project: "Project") -> None:
    """The resolver's infrastructure step (:func:`clustertrain.resolve.resolve`): the network ids and the policy ARN
    the project file leaves out come from the deployed stack's state beside the file, which the project keeps."""
    path = project_state_path(project)
    if project.aws is None or path is None:
        return
    state = read_state(path)
    if state is not None:
        project.attach_infra_state(state, tuple(apply_state(project.aws, state)))


def read_state(path: Path) -> InfraState | None:
    """The state at ``path``; None when there is none. A damaged file is one ConfigError line."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        raw: Any = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path}: not a readable infra state ({e}); deploy again with `clustertrain cluster infra deploy` "
                          "(it rewrites the file) or delete it") from None
    need = ("stack_name", "stack_id", "region", "status", "outputs")
    if not isinstance(raw, dict) or any(k not in raw for k in need) or not isinstance(raw.get("outputs"), dict):
        raise ConfigError(f"{path}: not an infra state written by `clustertrain cluster infra deploy` (needs {', '.join(need)}); "
                          "deploy again (it rewrites the file) or delete it")
    if not isinstance(raw.get("version", 1), int) or raw.get("version", 1) > STATE_VERSION:
        raise ConfigError(f"{path}: infra state version {raw.get('version')!r} is newer than this clustertrain understands "
                          f"({STATE_VERSION}); upgrade clustertrain")
    known = {k: raw[k] for k in InfraState.__dataclass_fields__ if k in raw}
    known["outputs"] = {str(k): str(v) for k, v in raw["outputs"].items()}
    return InfraState(**known)


def write_state(path: Path, state: InfraState) -> None:
    from clustertrain.core.run_paths import write_atomic

    write_atomic(Path(path), state.to_json())


def _get(aws: "AwsConfig", attrs: tuple[str, ...]) -> Any:
    obj: Any = aws
    for a in attrs:
        obj = getattr(obj, a)
    return obj


def apply_state(aws: "AwsConfig", state: InfraState) -> list[str]:
    """Fill every :data:`OUTPUT_FIELDS` field that ``aws`` leaves out from the state's outputs (same region only);
    return the project fields filled."""
    if state.region != aws.region:
        return []
    filled = []
    for output, (name, attrs) in OUTPUT_FIELDS.items():
        value = state.outputs.get(output)
        if value and _get(aws, attrs) is None:
            holder = _get(aws, attrs[:-1]) if len(attrs) > 1 else aws
            setattr(holder, attrs[-1], value)
            filled.append(name)
    return filled


def state_findings(project: "Project") -> list[Finding]:
    """What disagrees between the project and its recorded stack: a region mismatch, or an id the project file sets that
    differs from the stack's output. [] without a state file."""
    state = project.infra_state
    aws = project.aws
    if state is None or aws is None:
        return []
    where = project_state_path(project)
    if state.region != aws.region:
        return [Finding("error", "aws.region",
                        f"{aws.region} differs from the region of the deployed stack {state.stack_name} ({state.region}, recorded in {where})",
                        f"set aws.region back to {state.region}, or delete that stack first: "
                        f"clustertrain cluster infra delete PROJECT --set aws.region={state.region}")]
    out = []
    for output, (name, attrs) in OUTPUT_FIELDS.items():
        value, deployed = _get(aws, attrs), state.outputs.get(output)
        if deployed and value is not None and value != deployed and name not in project.filled_from_state:
            out.append(Finding("error", name, f"{value!r} differs from the deployed stack's {output} {deployed!r} ({where})",
                               f"remove {name} from the project file: the deployed id is read from {where}"))
    return out
