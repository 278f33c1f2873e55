"""What a change set does to the infrastructure stack, in words, and which of it is refused.

CloudFormation's ``DescribeChangeSet`` says per resource ``Action`` (Add / Modify / Remove / Import / Dynamic) and,
for a Modify, ``Replacement`` (True / False / Conditional). :func:`predict` computes the same from the two templates:
a resource is replaced when one of its *create-only* properties changes (the CloudFormation resource provider schema's
``createOnlyProperties``, read from the schemas cfn-lint ships; ``AWS::EC2::VPC`` ``CidrBlock``, ``AWS::S3::Bucket``
``BucketName``, ``AWS::EC2::Subnet`` ``CidrBlock``...), or when a create-only property refers (``Ref`` /
``Fn::GetAtt``) to a resource that is replaced (a new VPC means new subnets and security groups). :func:`merge` takes,
per resource, the stronger of AWS's answer and the prediction, so the refusal below holds even where the service
(or an emulator) leaves ``Replacement`` out, and ``infra status`` can say what a deploy would do before one runs.

:data:`GUARDED` types are never replaced without ``--allow-replace``: a new bucket is an empty bucket (the old one is
retained, but every dataset and checkpoint URI now points at an empty one), a new FSx file system is an empty one
under the same mount point (the old one is retained, unmounted), and a new VPC recreates every subnet, security
group and route, under a running cluster.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any, Iterable

#: resource types a deploy never replaces without --allow-replace
GUARDED = {"AWS::S3::Bucket": "S3 bucket", "AWS::EC2::VPC": "VPC", "AWS::FSx::FileSystem": "FSx file system"}
_RANK = {"": 0, "False": 0, "Conditional": 1, "True": 2}


@dataclass
class Change:
    action: str                # Add | Modify | Remove (CloudFormation's words)
    logical_id: str
    resource_type: str
    replacement: str = ""      # "" (not a Modify) | "False" | "Conditional" | "True"
    why: str = ""              # the create-only properties that force it, or the replaced resource it follows
    physical_id: str = ""

    @property
    def replaced(self) -> bool:
        return self.action == "Modify" and self.replacement in ("True", "Conditional")

    def describe(self) -> str:
        verb = {"Add": "add", "Remove": "remove", "Modify": "replace" if self.replaced else "modify"}.get(self.action, self.action.lower())
        extra = f" ({'may be ' if self.replacement == 'Conditional' else ''}replaced: {self.why})" if self.replaced and self.why else ""
        return f"{verb:<8} {self.logical_id} ({self.resource_type}){extra}"


@functools.lru_cache(maxsize=None)
def create_only(resource_type: str, region: str = "us-east-1") -> tuple[str, ...] | None:
    """Top-level create-only property names of ``resource_type`` (the provider schema cfn-lint ships); None when
    cfn-lint is not installed or does not know the type."""
    try:
        from cfnlint.schema import PROVIDER_SCHEMA_MANAGER
    except ImportError:
        return None
    try:
        schema = PROVIDER_SCHEMA_MANAGER.get_resource_schema(region.replace("_", "-"), resource_type).schema
    except Exception:  # cfn-lint's ResourceNotFoundError and friends: unknown type or region
        return None
    props = {p.split("/")[2] for p in schema.get("createOnlyProperties", []) if p.startswith("/properties/")}
    return tuple(sorted(props))


def _refs(node: Any) -> set[str]:
    """Logical ids a template fragment refers to (Ref, Fn::GetAtt, ${X} / ${X.Attr} in Fn::Sub)."""
    out: set[str] = set()
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "Ref" and isinstance(v, str):
                out.add(v)
            elif k == "Fn::GetAtt":
                out.add(v[0] if isinstance(v, list) else str(v).split(".")[0])
            elif k == "Fn::Sub":
                text = v[0] if isinstance(v, list) else v
                out.update(m.split(".")[0] for m in re.findall(r"\$\{([^}!]+)\}", str(text)))
                out |= _refs(v[1]) if isinstance(v, list) and len(v) > 1 else set()
            else:
                out |= _refs(v)
    elif isinstance(node, list):
        for v in node:
            out |= _refs(v)
    return out


def _resolve_params(node: Any, params: dict[str, Any]) -> Any:
    """``{"Ref": Param}`` replaced by the parameter's value, so a changed AvailabilityZone default is a changed value."""
    if isinstance(node, dict):
        if set(node) == {"Ref"} and node["Ref"] in params:
            return params[node["Ref"]]
        return {k: _resolve_params(v, params) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve_params(v, params) for v in node]
    return node


def _resources(template: dict[str, Any], parameters: dict[str, Any] | None) -> dict[str, Any]:
    params = {k: v.get("Default") for k, v in (template.get("Parameters") or {}).items()}
    params.update(parameters or {})
    return {k: _resolve_params(v, params) for k, v in (template.get("Resources") or {}).items()}


def predict(old: dict[str, Any], new: dict[str, Any], region: str = "us-east-1",
            old_parameters: dict[str, Any] | None = None, new_parameters: dict[str, Any] | None = None) -> list[Change]:
    """The changes from template ``old`` (deployed; ``{}`` for a new stack) to ``new``, in ``new``'s resource order."""
    a, b = _resources(old, old_parameters), _resources(new, new_parameters)
    changes: dict[str, Change] = {}
    for name, res in b.items():
        if name not in a:
            changes[name] = Change("Add", name, res.get("Type", ""))
        elif a[name] != res:
            changes[name] = Change("Modify", name, res.get("Type", ""), replacement="False")
    for name, res in a.items():
        if name not in b:
            changes[name] = Change("Remove", name, res.get("Type", ""))
    # direct replacements: a create-only property changed
    for name, ch in changes.items():
        if ch.action != "Modify" or a[name].get("Type") != b[name].get("Type"):
            if ch.action == "Modify":
                ch.replacement, ch.why = "True", "the resource type changed"
            continue
        fixed = create_only(ch.resource_type, region) or ()
        pa, pb = a[name].get("Properties") or {}, b[name].get("Properties") or {}
        moved = [p for p in fixed if pa.get(p) != pb.get(p)]
        if moved:
            ch.replacement, ch.why = "True", ", ".join(moved) + " changed"
    # replacements that follow: a create-only property refers to a replaced resource (to a fixed point)
    grew = True
    while grew:
        grew = False
        replaced = {n for n, c in changes.items() if c.replaced}
        for name, res in b.items():
            if name not in a or (name in changes and changes[name].replaced):
                continue
            fixed = create_only(res.get("Type", ""), region) or ()
            props = res.get("Properties") or {}
            hit = sorted(r for p in fixed if p in props for r in _refs(props[p]) if r in replaced)
            if hit:
                ch = changes.setdefault(name, Change("Modify", name, res.get("Type", "")))
                ch.replacement, ch.why = "True", f"it follows the new {hit[0]}"
                grew = True
    # resources whose other properties refer to a replaced one are updated in place with the new id
    replaced = {n for n, c in changes.items() if c.replaced}
    for name, res in b.items():
        if name in a and name not in changes:
            hit = sorted(_refs(res.get("Properties") or {}) & replaced)
            if hit:
                changes[name] = Change("Modify", name, res.get("Type", ""), replacement="False", why=f"it refers to the new {hit[0]}")
    order = list(b) + [n for n in a if n not in b]
    return [changes[n] for n in order if n in changes]


def from_aws(described: Iterable[dict[str, Any]]) -> list[Change]:
    """``DescribeChangeSet``'s ``Changes`` as :class:`Change` values."""
    out = []
    for item in described:
        rc = item.get("ResourceChange") or {}
        if not rc:
            continue
        why = ", ".join(sorted({d.get("Target", {}).get("Name", "") for d in rc.get("Details") or []
                                if d.get("Target", {}).get("RequiresRecreation") in ("Always", "Conditionally")} - {""}))
        out.append(Change(rc.get("Action", ""), rc.get("LogicalResourceId", ""), rc.get("ResourceType", ""),
                          replacement=str(rc.get("Replacement", "")) if rc.get("Action") == "Modify" else "",
                          why=f"{why} changed" if why else "", physical_id=rc.get("PhysicalResourceId", "") or ""))
    return out


def merge(aws: list[Change], predicted: list[Change]) -> list[Change]:
    """AWS's changes, each with the stronger replacement of AWS's and the prediction; a prediction AWS does not list is
    left out (AWS is the authority on what changes; the prediction only sharpens how)."""
    guess = {c.logical_id: c for c in predicted}
    out = []
    for c in aws:
        g = guess.get(c.logical_id)
        if c.action == "Modify" and g is not None and _RANK.get(g.replacement, 0) > _RANK.get(c.replacement, 0):
            c.replacement, c.why = g.replacement, g.why
        elif c.action == "Modify" and g is not None and not c.why:
            c.why = g.why
        out.append(c)
    return out


def refused(changes: list[Change]) -> list[Change]:
    """The changes a deploy refuses without --allow-replace: a bucket, a file system or the VPC replaced."""
    return [c for c in changes if c.replaced and c.resource_type in GUARDED]


def shrunk(old: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(logical id, deployed GiB, new GiB) of each FSx file system whose StorageCapacity ``new`` lowers: FSx only
    grows a file system (UpdateFileSystem, "you can only increase the amount of storage capacity"), so the stack
    update would fail on it and roll back. No flag allows it."""
    out = []
    for logical, res in (new.get("Resources") or {}).items():
        before = ((old.get("Resources") or {}).get(logical) or {})
        if res.get("Type") == before.get("Type") == "AWS::FSx::FileSystem":
            was, now = before.get("Properties", {}).get("StorageCapacity"), res.get("Properties", {}).get("StorageCapacity")
            if isinstance(was, int) and isinstance(now, int) and now < was:
                out.append((logical, was, now))
    return out
