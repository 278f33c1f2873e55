"""The watchdog's rules, pure: from every rank's heartbeat (:mod:`clustertrain.core.heartbeat_files`) and the clock,
is the job hung, or has a rank vanished, and who is to blame?

* **Lost rank**: a rank that has not left training (no ending record) and whose beacon has not written for
  ``3 x monitor.heartbeat_s + 5 s`` is gone: its process was killed or its node lost. Its node is blamed — unless
  every rank went quiet at once (then the file system or the whole job is frozen: no node stands out).
* **Hang**: no rank has entered a new phase for longer than the bound. The bound is ``hang_step_factor`` x the
  ranks' typical step time (their save time while one of them is in ``checkpoint``), at least ``hang_floor_s``
  and at most ``hang_ceiling_s``; before a step time is known (start-up, the first step) and for a first save,
  the ceiling. The ranks run the same program, so they pass the same beats: the ranks with the fewest beats are
  *behind* (stuck where the others wait for them); their nodes are blamed when they are not every node of the job.
  When every rank is at the same beat, none is behind (a collective that never completes: the network, NCCL, a
  stuck file system) and no node is blamed.
* A rank that never wrote a heartbeat is *missing*; past the ceiling since the watchdog started, that is a lost
  rank too (a node that never started it), blamed on the node Slurm placed it on when known.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from clustertrain.monitor.config import MonitorConfig
from clustertrain.core.heartbeat_files import Heartbeat

#: phases the watchdog does not bound: rank 0 waiting for the last checkpoint's upload after training
UNBOUNDED = ("upload",)


@dataclass(frozen=True)
class Verdict:
    """What the watchdog found (a hang, or a lost rank) and whom it blames."""

    kind: str                     # "hang" | "rank_lost"
    message: str                  # one line for people
    step: int
    phase: str
    ranks: list[int]              # the ranks behind / lost (empty: none stands out)
    nodes: list[str]              # their nodes, when blaming them is sound
    waited_s: float
    bound_s: float
    hosts: dict[str, str] = field(default_factory=dict)  # blamed node -> its machine's host name
    detected: float = 0.0         # when the verdict was reached (Unix seconds)


def dead_after(config: MonitorConfig) -> float:
    """Seconds without a write after which a rank's beacon is taken for gone."""
    return 3 * config.heartbeat_s + 5


def bound(beats: list[Heartbeat], config: MonitorConfig) -> tuple[float, str]:
    """(seconds without progress that make a hang, what they were derived from) for the live ranks ``beats``."""
    floor, ceiling, k = config.hang_floor_s, config.hang_ceiling_s, config.hang_step_factor
    if any(b.phase == "checkpoint" for b in beats):
        saves = [b.save_s for b in beats if b.save_s]
        if not saves:
            return ceiling, "the ceiling (no checkpoint save measured yet)"
        return min(ceiling, max(floor, k * max(saves))), f"{k:g} x the {max(saves):.1f} s save time"
    steps = [b.step_time_s for b in beats if b.step_time_s]
    if not steps or any(b.phase == "startup" for b in beats):
        return ceiling, "the ceiling (no step time measured yet)"
    return min(ceiling, max(floor, k * max(steps))), f"{k:g} x the {max(steps):.2f} s step time"


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _nodes_of(beats: dict[int, Heartbeat], ranks: list[int], expected: dict[int, str]) -> list[str]:
    return list(dict.fromkeys(beats[r].node if r in beats else expected.get(r, "?") for r in ranks))


def _blame(nodes: list[str], all_nodes: set[str]) -> list[str]:
    """Blame ``nodes`` only when they are not every node of the job (then the cause is no one node)."""
    nodes = [n for n in nodes if n != "?"]
    return nodes if nodes and set(nodes) < all_nodes else []


def judge(beats: dict[int, Heartbeat], world_size: int, now: float, config: MonitorConfig, since: float,
          expected: dict[int, str] | None = None) -> Verdict | None:
    """The verdict on the heartbeats ``beats`` (rank -> heartbeat) of a job of ``world_size`` ranks at ``now``; None
    when all is well. ``since``: when the watchdog began watching (a missing rank is judged from then);
    ``expected``: rank -> node, where the scheduler placed each rank (to name a rank that never wrote)."""
    verdict = _judge(beats, world_size, now, config, since, expected or {})
    return None if verdict is None else replace(verdict, detected=now)


def _judge(beats: dict[int, Heartbeat], world_size: int, now: float, config: MonitorConfig, since: float,
           expected: dict[int, str]) -> Verdict | None:
    live = {r: b for r, b in beats.items() if not b.done}
    all_nodes = {b.node for b in beats.values()} | set(expected.values())
    hosts = {b.node: b.host for b in beats.values() if b.host}
    missing = [r for r in range(world_size) if r not in beats]
    if missing and now - since > config.hang_ceiling_s:
        nodes = _nodes_of(beats, missing, expected)
        return Verdict("rank_lost", f"{_ranks(missing)} on {', '.join(nodes)} never started (no heartbeat in "
                       f"{now - since:.0f} s): the node did not start its ranks or they died at once",
                       0, "startup", missing, _blame(nodes, all_nodes), now - since, config.hang_ceiling_s, hosts)
    if not live:
        return None
    quiet = dead_after(config)
    dead = sorted(r for r, b in live.items() if now - b.alive > quiet)
    if dead:
        first = live[dead[0]]
        nodes = _nodes_of(live, dead, expected)
        # frozen: every rank went quiet and none left a last record (a rank that did saw the file system working)
        everyone = len(dead) == len(live) and len(live) == len(beats)
        tail = ("every rank went quiet at once: the file system or the whole job is frozen" if everyone
                else "its process was killed or its node is gone" if len(dead) == 1
                else "their processes were killed or their nodes are gone")
        return Verdict("rank_lost", f"{_ranks(dead)} on {', '.join(nodes)}: no heartbeat for "
                       f"{now - first.alive:.0f} s (last seen in {first.phase} of step {first.step}); {tail}",
                       first.step, first.phase, dead, [] if everyone else _blame(nodes, all_nodes),
                       now - first.alive, quiet, hosts)
    watched = [b for b in live.values() if b.phase not in UNBOUNDED]
    if not watched:
        return None
    limit, why = bound(watched, config)
    waited = now - max(b.since for b in watched)
    if waited <= limit:
        return None
    low, high = min(b.beat for b in watched), max(b.beat for b in watched)
    behind = sorted(b.rank for b in watched if b.beat == low) if low < high else []
    if behind:
        first = live[behind[0]]
        nodes = _nodes_of(live, behind, expected)
        others = [b for b in watched if b.beat != low]
        where = sorted({f"{b.phase} of step {b.step}" for b in others})
        wait = "the other rank waits" if len(others) == 1 else f"the other {len(others)} ranks wait"
        message = (f"{_ranks(behind)} on {', '.join(nodes)} {'is' if len(behind) == 1 else 'are'} stuck in "
                   f"{first.phase} of step {first.step} for {now - first.since:.0f} s (bound {limit:.0f} s: {why}); "
                   f"{wait} in {', '.join(where)}")
        return Verdict("hang", message, first.step, first.phase, behind, _blame(nodes, all_nodes), waited, limit,
                       hosts)
    first = watched[0]
    message = (f"all {len(watched)} ranks stopped in {first.phase} of step {first.step} {waited:.0f} s ago (bound "
               f"{limit:.0f} s: {why}), none behind the others: a collective that never completes (network, NCCL) "
               "or a stuck file system")
    return Verdict("hang", message, first.step, first.phase, [], [], waited, limit, hosts)
