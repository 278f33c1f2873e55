"""The flight recorder's evidence of a hang: which rank(s) never joined the collective the others wait in.

torch keeps a ring buffer of every rank's recent collectives when ``TORCH_FR_BUFFER_SIZE`` is set (the ranks set it
by default: :func:`clustertrain.train.distributed.flight_recorder_env`). At an incident each rank's beacon writes the
buffer's pickle to ``<incident>/flight/rank<R>`` (``torch._C._distributed_c10d._dump_fr_trace``); NCCL's own watchdog
writes the same format to ``RUN_DIR/flight/rank<R>`` when a collective outlives the process-group timeout
(``TORCH_NCCL_DUMP_ON_TIMEOUT``). :func:`analyse` runs torch's own analyser over a directory of them —
``torch/distributed/flight_recorder/components/loader.py`` ``read_dir`` and ``builder.py`` ``build_db``, what
``torchfrtrace`` (``fr_trace.py``) runs — and reads its verdict: the first collective whose ``missing_ranks`` is not
empty is the one that never completed, and those ranks never joined it.

torch 2.13's gloo backend records its collectives too, but files its group config under an empty name
(``pg_config: {'': {'name': '', 'desc': '', 'ranks': '[]'}}``) while the entries name their group (``('0',
'default_pg')``, ``('1', 'undefined')``): the analyser then cannot find the group (``KeyError``). Where every dump
has only that nameless config, :func:`analyse` rebuilds the configs from the entries first (:func:`_repair_gloo`;
recorded dump: ``tests/unit/monitor/fixtures/flight_gloo/``). NCCL's dumps carry their configs and are read as they
are. Anything the analyser cannot read is reported, not raised.
"""

from __future__ import annotations

import io
import logging
from contextlib import redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path

#: the dump files' name prefix (the rank follows): the beacon's and NCCL's (``TORCH_FR_DUMP_TEMP_FILE``)
PREFIX = "rank"


@dataclass(frozen=True)
class FlightVerdict:
    """What torch's analyser found in the ranks' flight recorder dumps."""

    ranks: list[int]                 # the ranks that never joined the collective (empty: none found)
    collective: str = ""             # e.g. "nccl:all_reduce"
    seq: int | None = None           # its collective sequence number in its group
    group: str = ""                  # the group's description (e.g. "default_pg")
    dumps: list[int] = field(default_factory=list)  # the ranks whose dumps were read
    error: str = ""                  # why no verdict could be read (the dumps are still there for people)

    def summary(self) -> str:
        if self.error:
            return f"flight recorder: not analysed ({self.error})"
        if not self.ranks:
            return f"flight recorder ({len(self.dumps)} dumps): every collective was joined by every rank"
        who = ("rank " if len(self.ranks) == 1 else "ranks ") + ", ".join(map(str, self.ranks))
        return (f"flight recorder ({len(self.dumps)} dumps): {who} never joined {self.collective} #{self.seq} of "
                f"{self.group or 'its group'}")

    def to_dict(self) -> dict:
        return {"ranks": self.ranks, "collective": self.collective, "seq": self.seq, "group": self.group,
                "dumps": self.dumps, "error": self.error}


def dump_ranks(directory: Path) -> list[int]:
    """The ranks with a dump in ``directory``."""
    out = []
    for f in directory.glob(f"{PREFIX}*") if directory.is_dir() else []:
        tail = f.name[len(PREFIX):]
        if tail.isdigit():
            out.append(int(tail))
    return sorted(out)


def _repair_gloo(details: dict) -> None:
    """Give gloo's dumps the group configs they lack (see the module docstring): each group the entries name, with
    the ranks whose entries name it (every rank that dumped, for the default group). A rank that never issued any
    collective of a group is then not counted in it — where a rank skipped one collective of a group it used before,
    which is a hang, it is."""
    if not details or any(set(d.get("pg_config") or {}) != {""} for d in details.values()):
        return
    members: dict[tuple[str, str], set[int]] = {}
    for d in details.values():
        for e in d.get("entries") or []:
            if e.get("process_group"):
                members.setdefault(tuple(e["process_group"]), set()).add(int(d["rank"]))
    everyone = {int(d["rank"]) for d in details.values()}
    configs = {name: {"name": name, "desc": desc, "ranks": str(sorted(everyone if desc == "default_pg" else ranks))}
               for (name, desc), ranks in members.items()}
    for d in details.values():
        d["pg_config"] = dict(configs)


def analyse(directory: Path) -> FlightVerdict | None:
    """torch's analyser over the dumps in ``directory`` (None: no dump there)."""
    ranks = dump_ranks(directory)
    if not ranks:
        return None
    try:
        from torch.distributed.flight_recorder.components.builder import build_db
        from torch.distributed.flight_recorder.components.config_manager import JobConfig
        from torch.distributed.flight_recorder.components.loader import read_dir
    except ImportError as e:
        return FlightVerdict([], dumps=ranks, error=f"torch's flight recorder analyser is not importable: {e}")
    quiet = logging.getLogger("Flight Recorder")
    level = quiet.level
    try:
        args = JobConfig().parse_args([str(directory), "--prefix", PREFIX, "--allow-incomplete-ranks"])
        quiet.setLevel(logging.CRITICAL)  # the analyser logs its findings as errors: we report them ourselves
        with redirect_stdout(io.StringIO()):
            details, version = read_dir(args)
            _repair_gloo(details)
            db = build_db(details, args, version)
    except (Exception, SystemExit) as e:  # noqa: BLE001 - evidence that cannot be read is reported, never fatal
        return FlightVerdict([], dumps=ranks, error=f"{type(e).__name__}: {e}"[:300])
    finally:
        quiet.setLevel(level)
    for c in db.collectives:
        if c.missing_ranks:
            return FlightVerdict(sorted(c.missing_ranks), c.collective_name, c.collective_seq_id, c.pg_desc, ranks)
    return FlightVerdict([], dumps=ranks)
