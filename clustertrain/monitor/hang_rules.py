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
* **On GPUs** the position that counts is the device's (``device_beat``/``device_phase``/``device_step`` of the
  heartbeat, from CUDA events at the phase boundaries: :class:`clustertrain.train.heartbeat_writer.Beacon`). The CPU
  queues kernels ahead of its GPU, so when a collective never completes every rank's CPU waits at the same sync and
  the host beats are equal; the devices are not: the rank whose GPU is still in an earlier phase (a spinning kernel,
  a slow forward) is the one the others' GPUs wait for in the collective, and it is blamed with its device's phase.
  A rank without device fields (CPU, or no boundary passed yet) is judged by its host position. Progress is either
  clock moving: a hang is neither the host nor the device of any rank entering a new phase for the bound.
* A rank that never wrote a heartbeat is *missing*; past the ceiling since the watchdog started, that is a lost
  rank too (a node that never started it), blamed on the node Slurm placed it on when known.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from clustertrain.monitor.config import MonitorConfig
from clustertrain.core.heartbeat_files import Heartbeat

#: phases the watchdog does not bound: rank 0 waiting for the last checkpoint's upload after training
UNBOUNDED = ("upload",)
#: how often the watchdog judges the heartbeats (:class:`clustertrain.monitor.hang_watchdog.Watchdog`)
POLL_S = 2.0
#: what the process-group timeout adds after the watchdog has collected its evidence: the CPU's lead over its GPU
#: (NCCL times a collective from when the CPU queued it, the watchdog from when a device or host last moved) and slack
PG_TIMEOUT_MARGIN_S = 120.0


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


@dataclass(frozen=True)
class Position:
    """Where a rank is in the program: its device's position when its heartbeat has one, else its host's."""

    rank: int
    beat: int
    phase: str
    step: int
    since: float
    device: bool  # from the device's events

    @staticmethod
    def of(b: Heartbeat) -> "Position":
        if b.device_beat is not None and b.device_phase is not None:
            return Position(b.rank, b.device_beat, b.device_phase, b.device_step or 0, b.device_since or b.since, True)
        return Position(b.rank, b.beat, b.phase, b.step, b.since, False)


def progress(b: Heartbeat) -> float:
    """When the rank last entered a phase, on its host or on its device."""
    return max(b.since, b.device_since or 0.0)


def evidence_wait_s(config: MonitorConfig) -> float:
    """How long the watchdog waits for the ranks' stacks and flight recorder dumps (and, again, for them to exit)."""
    return 2 * config.heartbeat_s + 10


def process_group_timeout_s(config: MonitorConfig) -> float:
    """The process-group timeout of the ranks (``init_process_group(timeout=...)``): NCCL's own watchdog ends a rank
    whose collective outlives it, so it must not fire before this watchdog has judged the hang and collected every
    rank's stack and flight recorder dump. The longest a hang goes unjudged is the ceiling of the bound
    (``hang_ceiling_s``), plus one heartbeat (a device's progress is seen at the beacon's next tick), plus one poll
    (:data:`POLL_S`); then the evidence wait and the exit wait (:func:`evidence_wait_s` each), plus
    :data:`PG_TIMEOUT_MARGIN_S`. At the defaults (ceiling 900 s, heartbeat 5 s): 900 + 5 + 2 + 2 x 20 + 120 = 1067 s,
    against torch's 600 s default, which killed the ranks of a first-step hang before the watchdog's 900 s."""
    return (config.hang_ceiling_s + config.heartbeat_s + POLL_S + 2 * evidence_wait_s(config)
            + PG_TIMEOUT_MARGIN_S)


def dead_after(config: MonitorConfig) -> float:
    """Seconds without a write after which a rank's beacon is taken for gone."""
    return 3 * config.heartbeat_s + 5


def bound(beats: list[Heartbeat], config: MonitorConfig) -> tuple[float, str]:
    """(seconds without progress that make a hang, what they were derived from) for the live ranks ``beats``."""
    floor, ceiling, k = config.hang_floor_s, config.hang_ceiling_s, config.hang_step_factor
    if any("checkpoint" in (b.phase, b.device_phase) for b in beats):
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


def blame_ranks(beats: dict[int, Heartbeat], ranks: list[int], expected: dict[int, str] | None = None) -> list[str]:
    """The nodes to blame for ``ranks`` (named by other evidence: the flight recorder), by the same rule as a
    verdict's: not when they are every node of the job."""
    expected = expected or {}
    all_nodes = {b.node for b in beats.values()} | set(expected.values())
    return _blame(_nodes_of(beats, ranks, expected), all_nodes)


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
    waited = now - max(progress(b) for b in watched)
    if waited <= limit:
        return None
    at = {b.rank: Position.of(b) for b in watched}
    low, high = min(p.beat for p in at.values()), max(p.beat for p in at.values())
    behind = sorted(r for r, p in at.items() if p.beat == low) if low < high else []
    if behind:
        first = at[behind[0]]
        nodes = _nodes_of(live, behind, expected)
        others = [p for p in at.values() if p.beat != low]
        where = sorted({f"{p.phase} of step {p.step}" for p in others})
        gpus = all(p.device for p in others)  # the others' devices wait: say so
        if len(others) == 1:
            waits = "the other rank's GPU waits" if gpus else "the other rank waits"
        else:
            waits = f"the other {len(others)} ranks' GPUs wait" if gpus else f"the other {len(others)} ranks wait"
        on = " on its GPU" if first.device else ""
        message = (f"{_ranks(behind)} on {', '.join(nodes)} {'is' if len(behind) == 1 else 'are'} stuck in "
                   f"{first.phase} of step {first.step}{on} for {now - first.since:.0f} s (bound {limit:.0f} s: {why}); "
                   f"{waits} in {', '.join(where)}")
        return Verdict("hang", message, first.step, first.phase, behind, _blame(nodes, all_nodes), waited, limit,
                       hosts)
    first = at[watched[0].rank]
    on = " (their GPUs too)" if all(p.device for p in at.values()) else ""
    message = (f"all {len(watched)} ranks stopped in {first.phase} of step {first.step}{on} {waited:.0f} s ago (bound "
               f"{limit:.0f} s: {why}), none behind the others: a collective that never completes (network, NCCL) "
               "or a stuck file system")
    return Verdict("hang", message, first.step, first.phase, [], [], waited, limit, hosts)
