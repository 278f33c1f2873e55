"""How clustertrain reads typed files: one strict base for what users write, one lenient base for
what clustertrain itself wrote, and one loader that turns YAML and validation errors into one line
naming ``file:line`` and the fix.

* :class:`StrictModel` — user input (the project file, thresholds, requirements): unknown keys are
  errors, so a typo never passes silently.
* :class:`StoredModel` — state a run wrote (``run.json``, ``status.json``, resolved ``config.yaml``
  read back by ranks, manifests, reports): unknown keys are ignored, so a file written by a newer
  clustertrain still reads (the version check is explicit, see :mod:`clustertrain.rundir`).
* :func:`load_yaml_model` — read a YAML file into a model; :func:`read_yaml` and
  :func:`validate_model` are its two halves for callers that edit the mapping in between
  (``--set`` overrides).

This is a leaf module: it imports nothing else from clustertrain except :mod:`clustertrain.errors`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from clustertrain.errors import ClusterTrainError, ConfigError

M = TypeVar("M", bound=BaseModel)


class StrictModel(BaseModel):
    """User input: unknown keys are errors; assignments are validated too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class StoredModel(BaseModel):
    """Files clustertrain wrote and reads back: fields a newer version added are ignored."""

    model_config = ConfigDict(extra="ignore")


def read_yaml(path: Path, error: type[ClusterTrainError] = ConfigError) -> Any:
    """Parse a YAML file; a missing file, syntax or encoding error becomes one line naming file:line:column."""
    path = Path(path)
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise error(f"{path}: file not found; check the path") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise error(f"{path}{where}: YAML syntax error: {problem}; fix the YAML at that position") from None
    except UnicodeDecodeError:
        raise error(f"{path}: not UTF-8 text; save it as UTF-8") from None


def load_yaml_model(path: Path, model: type[M], error: type[ClusterTrainError] = ConfigError) -> M:
    """Read ``path`` (YAML or JSON) and validate it as ``model``; every mistake is one ``error`` line
    that names ``file:line``, the key and the fix."""
    path = Path(path)
    raw = read_yaml(path, error)
    return validate_model(raw if raw is not None else {}, model, str(path), error=error, path=path)


def validate_model(raw: Any, model: type[M], source: str, error: type[ClusterTrainError] = ConfigError,
                   path: Path | None = None) -> M:
    """Validate ``raw`` as ``model``; a failure raises ``error`` with :func:`format_validation_error`'s line.
    With ``path`` the line number of the offending key is looked up in that YAML file."""
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise error(format_validation_error(e, source, model, path)) from None


def format_validation_error(err: ValidationError, source: str, root: type[BaseModel] | None = None,
                            path: Path | None = None) -> str:
    """One line for a pydantic error: ``source[:line]: key.path: what is wrong and the fix`` (the first
    error; the count of the others). Unknown keys list the valid keys of that section."""
    errors = err.errors()
    first = errors[0]
    loc = tuple(first["loc"])
    where = loc_str(loc)
    line = yaml_line(path, loc) if path is not None else None
    src = f"{source}:{line}" if line else source
    if first["type"] == "extra_forbidden":
        owner = model_at(root, loc) if root is not None else None
        valid = ", ".join(owner.model_fields) if owner else "see the reference documentation"
        msg = f"{src}: {where}: unknown key; valid keys here: {valid}"
    elif first["type"] == "missing":
        msg = f"{src}: {where}: required key is missing; add it (see docs/project-file.md)"
    else:
        text = first["msg"].removeprefix("Value error, ")
        got = first.get("input")
        shown = "" if isinstance(got, (dict, list)) or got is None or first["type"].startswith("value_error") else f" (got {got!r})"
        msg = f"{src}: {where}: {text}{shown}" if where else f"{src}: {text}{shown}"
    if len(errors) > 1:
        msg += f" (and {len(errors) - 1} more error{'s' if len(errors) > 2 else ''})"
    return msg


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
