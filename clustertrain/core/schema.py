"""How clustertrain reads typed files: one strict base for what users write, one lenient base for
what clustertrain itself wrote, and one loader that turns YAML and validation errors into one line per mistake
naming ``file:line``, the key and the fix (unknown keys first, with the closest valid key).

* :class:`StrictModel` — user input (the project file, thresholds, requirements): unknown keys are
  errors, so a typo never passes silently.
* :class:`StoredModel` — state a run wrote (``run.json``, ``status.json``, resolved ``config.yaml``
  read back by ranks, manifests, reports): unknown keys are ignored, so a file written by a newer
  clustertrain still reads (the version check is explicit, see :mod:`clustertrain.core.run_paths`).
* :func:`load_yaml_model` — read a YAML file into a model; :func:`read_yaml` and
  :func:`validate_model` are its two halves for callers that edit the mapping in between
  (``--set`` overrides); :func:`require_mapping` says what a file that is not a mapping holds instead.

This is a leaf module: it imports nothing else from clustertrain except :mod:`clustertrain.core.errors`.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from clustertrain.core.errors import ClusterTrainError, ConfigError

M = TypeVar("M", bound=BaseModel)


class StrictModel(BaseModel):
    """User input: unknown keys are errors; assignments are validated too. ``doc_reference``: where a root
    model's fields are documented (named when a required key is missing)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    doc_reference: ClassVar[str | None] = None


class StoredModel(BaseModel):
    """Files clustertrain wrote and reads back: fields a newer version added are ignored."""

    model_config = ConfigDict(extra="ignore")


class _DuplicateKey(yaml.constructor.ConstructorError):
    """A key written twice in one YAML mapping."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.safe_load`` that refuses a key written twice in one mapping (PyYAML keeps the last one silently,
    so a second ``training:`` under a model would throw the first away). Merge keys (``<<: *base``) may still
    be overridden: only the keys written in the mapping itself are compared."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set[str] = set()
        for key, _ in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                if key.value in seen:
                    problem = f"key {key.value!r} is written twice in one mapping; keep one of them"
                    raise _DuplicateKey(None, None, problem, key.start_mark)
                seen.add(key.value)
        return super().construct_mapping(node, deep)


def read_yaml(path: Path, error: type[ClusterTrainError] = ConfigError) -> Any:
    """Parse a YAML file; a missing or unreadable file, a syntax or encoding error, or a key written twice
    becomes one line naming file:line[:column] and the fix."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise error(f"{path}: file not found; check the path") from None
    except OSError as e:
        raise error(f"{path}: cannot be read ({e.strerror}); pass a readable file") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise error(f"{path}:{line}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); "
                    "save it as UTF-8") from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        if isinstance(e, _DuplicateKey):
            raise error(f"{path}{where}: {problem}") from None
        tab = "'\\t'" in problem
        fix = "indent with spaces (YAML does not allow tabs there)" if tab else "fix the YAML at that position"
        raise error(f"{path}{where}: YAML syntax error: {problem}; {fix}") from None


def require_mapping(raw: Any, path: Path, expected: str, error: type[ClusterTrainError] = ConfigError) -> dict:
    """``raw`` (what :func:`read_yaml` returned) when it is a mapping; else one line saying what the file holds
    instead and what it should hold (``expected``, e.g. "a YAML mapping with keys name, cluster, models")."""
    if isinstance(raw, dict):
        return raw
    held = "is empty" if raw is None else f"holds a YAML {'list' if isinstance(raw, list) else 'scalar'}, not a mapping"
    raise error(f"{path}: the file {held}; write {expected}")


def load_yaml_model(path: Path, model: type[M], error: type[ClusterTrainError] = ConfigError) -> M:
    """Read ``path`` (YAML or JSON) and validate it as ``model``; every mistake is one line of the ``error``
    that names ``file:line``, the key and the fix."""
    path = Path(path)
    raw = read_yaml(path, error)
    return validate_model(raw if raw is not None else {}, model, str(path), error=error, path=path)


def validate_model(raw: Any, model: type[M], source: str, error: type[ClusterTrainError] = ConfigError,
                   path: Path | None = None) -> M:
    """Validate ``raw`` as ``model``; a failure raises ``error`` with :func:`format_validation_error`'s lines.
    With ``path`` the line number of the offending key is looked up in that YAML file."""
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise error(format_validation_error(e, source, model, path)) from None


def format_validation_error(err: ValidationError, source: str, root: type[BaseModel] | None = None,
                            path: Path | None = None) -> str:
    """One line per mistake (:func:`ordered_errors`), each ``source[:line]: key.path: what is wrong and the fix``
    (:func:`format_error`), joined by newlines; a message of one mistake is one line."""
    lines = [format_error(e, source, root, path) for e in ordered_errors(err, root)]
    return "\n".join(dict.fromkeys(lines))


def ordered_errors(err: ValidationError, root: type[BaseModel] | None = None) -> list[dict]:
    """The errors of ``err`` to report, the cause before its consequences: unknown keys first, then the other field
    errors, then the cross-field checks (a model validator's message about a whole section). A required key that
    an unknown key of the same section plausibly meant (its close match: ``max_step`` for ``max_steps``) is left
    out: it is missing because of the typo, which is reported."""
    errors = list(err.errors())
    meant = set()
    for e in errors:
        loc = tuple(e["loc"])
        if e["type"] == "extra_forbidden" and loc and root is not None:
            close = close_key(str(loc[-1]), model_at(root, loc))
            if close is not None:
                meant.add(loc[:-1] + (close,))
    kept = [e for e in errors if not (e["type"] == "missing" and tuple(e["loc"]) in meant)]
    return sorted(_merge_union_members(kept, root), key=lambda e: _rank(e, root))


def _merge_union_members(errors: list[dict], root: type[BaseModel] | None) -> list[dict]:
    """One error per field: a value a union field (``dp: int | 'auto'``) refuses fails each member, and pydantic names
    each under a tag (``dp.int``, ``dp.literal['auto']``); those become one error at the field whose message lists
    what each member wants (``Input should be a valid integer, ..., or 'auto'``)."""
    if root is None:
        return errors
    merged: dict[tuple, dict] = {}
    out: list[dict] = []
    for e in errors:
        loc = tuple(e["loc"])
        field = _field_loc(root, loc)
        if field == loc or e["type"] in ("extra_forbidden", "missing"):
            out.append(e)
        elif field in merged:
            first = merged[field]
            if e["msg"] not in first["msg"]:
                first["msg"] += f", or {e['msg'].removeprefix('Input should be ')}"
        else:
            merged[field] = {**e, "loc": field}
            out.append(merged[field])
    return out


def _field_loc(root: type[BaseModel], loc: tuple) -> tuple:
    """``loc`` without the union-member tags pydantic appends after a field that is not a section
    (``("models", 0, "parallelism", "dp", "int")`` → ``(..., "dp")``)."""
    cls: Any = root
    for i, p in enumerate(loc):
        if isinstance(p, int):
            continue
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)):
            return loc[:i] if cls is _LEAF else loc
        if p not in cls.model_fields:
            return loc
        ann = cls.model_fields[p].annotation
        models = [a for a in (ann, *getattr(ann, "__args__", ())) if isinstance(a, type) and issubclass(a, BaseModel)]
        containers = any(getattr(a, "__origin__", None) in (list, tuple, dict, set)  # list[X], list[X] | None, ...
                         for a in (ann, *getattr(ann, "__args__", ())))
        cls = models[0] if models else (None if containers else _LEAF)
    return loc


_LEAF = object()  # a field holding a value, not a section: what follows it in a location is a union member's tag


def _rank(error: dict, root: type[BaseModel] | None) -> int:
    """0 an unknown key, 1 a field's own error, 2 a cross-field check (raised by a model's validator: its
    location is a whole section, or none)."""
    if error["type"] == "extra_forbidden":
        return 0
    if error["type"].startswith(("value_error", "assertion_error")):
        loc = tuple(error["loc"])
        if not loc or (root is not None and model_at(root, (*loc, "")) is not None):
            return 2
    return 1


def close_key(key: str, owner: type[BaseModel] | None) -> str | None:
    """The valid key of ``owner`` closest to the unknown ``key`` (``max_step`` → ``max_steps``), or None."""
    if owner is None:
        return None
    close = difflib.get_close_matches(key, list(owner.model_fields), n=1, cutoff=0.6)
    return close[0] if close else None


def format_error(error: dict, source: str, root: type[BaseModel] | None = None, path: Path | None = None) -> str:
    """One line for one pydantic error: ``source[:line]: key.path: what is wrong and the fix``. Unknown keys name
    the closest valid key and list the valid keys of that section."""
    loc = tuple(error["loc"])
    where = loc_str(loc)
    line = yaml_line(path, loc or leading_loc(error["msg"])) if path is not None else None
    src = f"{source}:{line}" if line else source
    if error["type"] == "extra_forbidden":
        owner = model_at(root, loc) if root is not None else None
        valid = ", ".join(owner.model_fields) if owner else "see the reference documentation"
        close = close_key(str(loc[-1]), owner) if loc else None
        hint = f"did you mean `{close}`? " if close else ""
        return f"{src}: {where}: unknown key; {hint}valid keys here: {valid}"
    if error["type"] == "missing":
        ref = getattr(root, "doc_reference", None)
        return f"{src}: {where}: required key is missing; add it{f' (see {ref})' if ref else ''}"
    text = error["msg"].removeprefix("Value error, ")
    got = error.get("input")
    shown = "" if isinstance(got, (dict, list)) or got is None or error["type"].startswith("value_error") else f" (got {got!r})"
    return f"{src}: {where}: {text}{shown}" if where else f"{src}: {text}{shown}"


_LEADING_PATH = re.compile(r"(?:Value error, )?([A-Za-z_]\w*(?:\[\d+\]|\.[A-Za-z_]\w*)*)[ :]")


def leading_loc(msg: str) -> tuple:
    """The field path a root validator's message starts with (``models[1].name 'a' is used twice`` →
    ``("models", 1, "name")``), so its line can be looked up; ``()`` when it starts with none."""
    m = _LEADING_PATH.match(msg)
    if not m or ("." not in m.group(1) and "[" not in m.group(1)):
        return ()
    return tuple(int(p) if p.isdigit() else p for p in re.findall(r"[A-Za-z_]\w*|\d+", m.group(1)))


def loc_str(loc: tuple) -> str:
    """``("models", 0, "training", "lr")`` → ``models[0].training.lr``."""
    out = ""
    for p in loc:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def model_at(root: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The pydantic model class whose field set contains the last element of ``loc``."""
    cls: Any = root
    for p in loc[:-1]:
        if isinstance(p, int):
            continue
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or p not in cls.model_fields:
            return None
        ann = cls.model_fields[p].annotation
        args = [a for a in getattr(ann, "__args__", ()) if isinstance(a, type) and issubclass(a, BaseModel)]
        cls = args[0] if args else ann
    return cls if isinstance(cls, type) and issubclass(cls, BaseModel) else None


def yaml_line(path: Path, loc: tuple) -> int | None:
    """The 1-based line of the deepest key of ``loc`` that exists in the YAML file (None when unknown).
    List items may be addressed by index or, as ``--set`` does, by their ``name``."""
    try:
        node = yaml.compose(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    line = None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if key.value == str(part):
                    line, node = key.start_mark.line + 1, value
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode):
            items = node.value
            item = None
            if isinstance(part, int) and 0 <= part < len(items):
                item = items[part]
            else:
                for it in items:
                    if isinstance(it, yaml.MappingNode) and any(k.value == "name" and v.value == str(part) for k, v in it.value):
                        item = it
            if item is None:
                return line
            line, node = item.start_mark.line + 1, item
        else:
            return line
    return line
