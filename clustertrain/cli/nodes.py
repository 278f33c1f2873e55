"""`clustertrain nodes list | add | clear PROJECT`: the project's suspect nodes (format and rules:
:mod:`clustertrain.monitor.suspects`; the file is ``storage_layout(project).suspects_file()``).

The watchdog puts a node on the list when it blames it for a hang or a lost rank; ``submit`` leaves the active
entries out of the project's jobs (:mod:`clustertrain.launch.exclusion`). ``list`` shows the active entries
(``--all``: every entry with its fate: active, expired, cleared, superseded by a newer one); ``add`` blames nodes
by hand (source ``manual``, for ``monitor.suspect_ttl_h`` hours unless ``--hours``); ``clear`` ends the entries
of the named nodes, or of all. Names are not checked against Slurm (this works offline); a name that is empty,
holds blanks, a comma or another character than letters, digits, ``.``, ``_``, ``-`` is refused;
``node[1-3]`` stands for node1 node2 node3. The file's shared file system must be mounted here: on a cluster,
run it on the head node.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from clustertrain.cli.common import command_group, plain_table
from clustertrain.cli.jobs import SET_HELP
from clustertrain.core.errors import ConfigError, RunDirError
from clustertrain.resolve import load_project

if TYPE_CHECKING:
    from clustertrain.monitor.suspects import Suspect
    from clustertrain.project import Project

app = command_group(help="The project's suspect nodes, which its jobs exclude: list them, add some by hand, "
                         "clear them.")

_PROJECT = typer.Argument(..., help="Project file (YAML).")
_SET = typer.Option([], "--set", help=SET_HELP)
COLUMNS = ("node", "source", "job", "model", "added", "expires in", "reason")


@app.command("list")
def list_nodes(
    project_file: Path = _PROJECT,
    set_: list[str] = _SET,
    history: bool = typer.Option(False, "--all", help="Every entry, also expired, cleared and superseded ones."),
    as_json: bool = typer.Option(False, "--json", help="Print the entries as a JSON list."),
) -> None:
    """The nodes this project's jobs exclude now: node, source, job, model, when added, when it expires, reason."""
    path = suspects_file(load_project(project_file, set_))
    rows = suspect_rows(path, time.time(), history)
    if as_json:
        typer.echo(json.dumps(rows, indent=1))
    elif not rows:
        typer.echo(f"no {'' if history else 'active '}suspect nodes ({path})")
    else:
        typer.echo(render_rows(rows, history))


@app.command("add")
def add(
    project_file: Path = _PROJECT,
    nodes: list[str] = typer.Argument(..., help="Slurm node names (node[1-3] for several)."),
    reason: str = typer.Option(..., "--reason", help="Why, in one line (shown by `nodes list` and `submit`)."),
    hours: Optional[float] = typer.Option(None, "--hours", help="How long [default: monitor.suspect_ttl_h]."),
    set_: list[str] = _SET,
) -> None:
    """Put nodes on the suspect list by hand (source manual): the project's jobs exclude them until they expire."""
    from clustertrain.monitor.suspects import add_suspect

    project = load_project(project_file, set_)
    names = node_names(nodes)
    if not reason.strip():
        raise ConfigError("--reason is empty: say in one line why the node is suspect, e.g. --reason 'XID 79 on GPU 3'")
    ttl = project.monitor.suspect_ttl_h if hours is None else hours
    if not 0 < ttl <= 24 * 90:
        raise ConfigError(f"--hours {ttl:g}: give a number of hours above 0 and at most 2160 (90 days)")
    path = suspects_file(project)
    for name in names:
        entry = _writing(path, lambda: add_suspect(path, name, source="manual", reason=reason, ttl_h=ttl))
        typer.echo(f"added {entry.node}: excluded until {_when(entry.expires)} ({path})")


@app.command("clear")
def clear(
    project_file: Path = _PROJECT,
    nodes: Optional[list[str]] = typer.Argument(None, help="Slurm node names [default: every node on the list]."),
    set_: list[str] = _SET,
) -> None:
    """End the suspect entries of the named nodes (none named: all); prints what was cleared."""
    from clustertrain.monitor.suspects import clear_suspects

    project = load_project(project_file, set_)
    names = node_names(nodes) if nodes else None
    path = suspects_file(project)
    cleared = _writing(path, lambda: clear_suspects(path, names))
    missing = [n for n in names or () if n not in cleared]
    if cleared:
        typer.echo(f"cleared {', '.join(cleared)}")
    if missing:
        typer.echo(f"not an active suspect: {', '.join(missing)}")
    if not cleared and not missing:
        typer.echo(f"nothing to clear: no active suspect node ({path})")


def node_names(args: list[str]) -> list[str]:
    """The node names of ``args``, hostlist brackets expanded; one ConfigError line for a name that cannot be one
    (the batch script takes only what :data:`clustertrain.launch.sbatch.NODE_NAME_RE` allows)."""
    from clustertrain.launch.sbatch import NODE_NAME_RE
    from clustertrain.core.ranks import expand_hostlist

    names: list[str] = []
    for arg in args:
        if not arg.strip() or any(c.isspace() for c in arg) or "," in arg:
            raise ConfigError(f"node name {arg!r}: a Slurm node name is not empty and holds no blank or comma; "
                              "give each node as its own argument (e.g. node1 node2, or node[1-2])")
        for name in expand_hostlist(arg):
            if not NODE_NAME_RE.match(name):
                raise ConfigError(f"node name {name!r}: Slurm node names here are letters, digits, '.', '_' and '-'")
            names.append(name)
    return list(dict.fromkeys(names))


def suspects_file(project: "Project") -> Path:
    """The project's list; refused when it lies on a cluster mount this machine does not have (reading would say
    "none", writing would make a local file no job reads)."""
    from clustertrain.core.storage_layout import require_mounted, storage_layout

    path = storage_layout(project).suspects_file()
    require_mounted(project, path, "the suspect-node list", "clustertrain nodes")
    return path


def _writing(path: Path, write: Any) -> Any:
    try:
        return write()
    except OSError as err:
        raise RunDirError(f"cannot write {path}: {err.strerror or err}; check the directory's permissions") from None


def suspect_rows(path: Path, now: float, history: bool = False) -> list[dict[str, Any]]:
    """The active entries (``history``: every entry, oldest first, with its ``state``) as plain dicts."""
    from clustertrain.monitor.suspects import Clear, active_suspects, read_suspects

    active = active_suspects(path, now)
    if not history:
        return [_row(s, now, "active") for s in active.values()]
    entries = read_suspects(path)
    rows = []
    for i, entry in enumerate(entries):
        if isinstance(entry, Clear):
            continue
        cleared = any(isinstance(e, Clear) and e.clear in ("*", entry.node) for e in entries[i + 1:])
        state = ("active" if active.get(entry.node) == entry else "cleared" if cleared
                 else "expired" if entry.expires <= now else "superseded")
        rows.append(_row(entry, now, state))
    return rows


def _row(entry: "Suspect", now: float, state: str) -> dict[str, Any]:
    return {"node": entry.node, "host": entry.host, "source": entry.source, "reason": entry.reason, "job": entry.job,
            "model": entry.model, "added": entry.time, "expires": entry.expires,
            "expires_in_s": round(max(0.0, entry.expires - now), 1), "state": state}


def render_rows(rows: list[dict[str, Any]], history: bool) -> str:
    """A plain rich table, one line per entry, reason last (it may be long: the console is wider than any line, so
    it is neither wrapped nor cut); ``history`` adds the state column. No borders, colour or markup; no trailing
    blanks."""
    from clustertrain.monitor.status import human_duration

    head = [*COLUMNS[:-1], *(("state",) if history else ()), COLUMNS[-1]]
    cells = [[r["node"], r["source"], r["job"] or "-", r["model"] or "-", _when(r["added"]),
              human_duration(r["expires_in_s"]) if r["expires_in_s"] else "expired",
              *((r["state"],) if history else ()), r["reason"] or "-"] for r in rows]
    return plain_table(head, cells)


def _when(stamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(stamp))
