"""One writer per run directory (clustertrain.core.run_lease): a live process holder is refused by name and nothing is
written; a holder whose process is gone is taken over; a Slurm holder is alive while its job chain is (the successor
its end marker names, then Slurm's state). Slurm's state comes through the module's one seam, ``state(job)``: here a
table of what ``squeue -h -j ID -o %T`` prints (its real words), since no controller runs in the unit tests; the
integration tests (tests/integration/train/test_one_writer.py, tests/integration/launch/test_one_writer_slurm.py) ask a real local Slurm."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from clustertrain.core.run_lease import LEASE, LeaseHeld, check_for_job, read_lease, take, wait_for_job
from clustertrain.core.run_paths import RunPaths

HOLDER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from clustertrain.core.run_lease import take
    from clustertrain.core.run_paths import RunPaths
    taken = take(RunPaths(Path(sys.argv[1])), "run")
    print("held", flush=True)
    sys.stdin.read()
""")


def states(table: dict[str, str | None]):
    def state(job: str) -> str | None:
        return table.get(job)
    return state


def unreachable(job: str) -> str | None:
    raise OSError("slurm_load_jobs error: Unable to contact slurm controller (connect failure)")


def listing(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def end_marker(paths: RunPaths, job: str, state: str = "FAILED", next_job: str = "") -> None:
    (paths.root / "jobs").mkdir(parents=True, exist_ok=True)
    (paths.root / "jobs" / f"{job}.end").write_text(
        f"version=1\nstate={state}\nexit_code=1\nrestarts=0\nended=1795000100\nnext_job={next_job}\n")


@pytest.fixture
def holder(tmp_path):
    """Another process that holds the lease of tmp_path/run (as a live `clustertrain run` does)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "run")], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    yield proc
    proc.kill()
    proc.wait()


def test_a_new_run_directory_is_created_and_leased_to_this_process(tmp_path):
    paths = RunPaths(tmp_path / "run")
    taken = take(paths, "run")
    lease = read_lease(paths)
    assert (lease.kind, lease.pid, lease.command, taken.note) == ("process", os.getpid(), "run", None)
    taken.release()


def test_a_live_holder_is_refused_by_pid_and_host_and_nothing_is_written(tmp_path, holder):
    paths = RunPaths(tmp_path / "run")
    before = listing(paths.root)
    with pytest.raises(LeaseHeld) as err:
        take(paths, "submit")
    message = str(err.value)
    assert f"pid {holder.pid} on " in message and "(clustertrain run)" in message and f"kill {holder.pid}" in message
    assert "\n" not in message and message.startswith(str(paths.root))
    assert listing(paths.root) == before


def test_a_holder_whose_process_is_gone_is_taken_over_and_said(tmp_path, holder):
    paths = RunPaths(tmp_path / "run")
    holder.kill()
    holder.wait()
    taken = take(paths, "run")
    assert taken.note is not None and f"pid {holder.pid}" in taken.note and "no longer holds it" in taken.note
    assert read_lease(paths).pid == os.getpid()
    taken.release()


def test_the_lease_is_released_when_the_holder_releases_it(tmp_path):
    paths = RunPaths(tmp_path / "run")
    first = take(paths, "run")
    with pytest.raises(LeaseHeld):  # flock is per open file: a second take in one process is refused too
        take(paths, "run")
    first.release()
    second = take(paths, "run")
    assert second.note is not None and "no longer holds it" in second.note
    second.release()


def test_a_queued_job_holds_the_lease_until_its_chain_ends(tmp_path):
    paths = RunPaths(tmp_path / "run")
    take(paths, "submit").hand_to_job("41")
    assert read_lease(paths).kind == "slurm" and read_lease(paths).job == "41"
    for word in ("PENDING", "RUNNING", "REQUEUED", "COMPLETING"):
        with pytest.raises(LeaseHeld, match=r"in use by Slurm job 41; .*scancel 41"):
            take(paths, "submit", states({"41": word}))
    before = listing(paths.root)
    end_marker(paths, "41", next_job="42")  # a watchdog resubmission carries the run on as job 42
    with pytest.raises(LeaseHeld, match=r"in use by Slurm job 42; wait for job 42 \(it carries on job 41\)"):
        take(paths, "submit", states({"42": "PENDING"}))
    assert {k: v for k, v in listing(paths.root).items() if not k.startswith("jobs/")} == \
        {k: v for k, v in before.items() if not k.startswith("jobs/")}
    taken = take(paths, "submit", states({"42": "COMPLETED"}))  # ended: Slurm still lists it, not alive
    assert "Slurm job 41" in taken.note
    taken.release()


def test_a_job_slurm_has_forgotten_or_that_ended_releases_the_lease(tmp_path):
    paths = RunPaths(tmp_path / "run")
    take(paths, "submit").hand_to_job("7")
    take(paths, "run", states({})).release()  # squeue no longer knows 7: killed without an end marker
    take(paths, "submit").hand_to_job("8")
    end_marker(paths, "8", state="COMPLETED")
    take(paths, "run", unreachable).release()  # its own end marker says it ended: Slurm need not be asked


def test_an_unreachable_controller_keeps_a_job_lease_and_says_what_to_do(tmp_path):
    paths = RunPaths(tmp_path / "run")
    take(paths, "submit").hand_to_job("9")
    with pytest.raises(LeaseHeld) as err:
        take(paths, "run", unreachable)
    assert "leased to Slurm job 9" in str(err.value) and "local-slurm env" in str(err.value)
    assert str(paths.root / LEASE) in str(err.value)


def test_the_ranks_train_under_their_own_job_or_chain_and_refuse_another_live_one(tmp_path):
    paths = RunPaths(tmp_path / "run")
    take(paths, "submit").hand_to_job("41")
    assert check_for_job(paths, "41", state=unreachable) is None  # a requeued job: its own lease, Slurm not asked
    assert check_for_job(paths, "43", chain_job="41", state=unreachable) is None  # a resubmission of its chain
    assert read_lease(paths).job == "41"
    before = listing(paths.root)
    with pytest.raises(LeaseHeld, match=r"in use by Slurm job 41; .* \(refused by Slurm job 50\)"):
        check_for_job(paths, "50", state=states({"41": "RUNNING"}))
    assert listing(paths.root) == before
    wait_for_job(paths, "43", chain_job="41", wait_s=0)
    with pytest.raises(LeaseHeld, match="not leased to Slurm job 50"):
        wait_for_job(paths, "50", wait_s=0)


def test_the_ranks_take_over_an_ended_holder_and_follow_their_chain(tmp_path):
    paths = RunPaths(tmp_path / "run")
    take(paths, "submit").hand_to_job("41")
    end_marker(paths, "41", next_job="43")  # the resubmission started before any rank saw the lease
    assert check_for_job(paths, "43", state=states({"43": "RUNNING"})) is None
    assert read_lease(paths).job == "43"
    end_marker(paths, "43", state="COMPLETED")
    note = check_for_job(paths, "60", state=states({}))  # a job sbatch'ed by hand after the chain ended
    assert note is not None and "Slurm job 43" in note and read_lease(paths).job == "60"


def test_a_live_process_lease_refuses_the_ranks_after_waiting(tmp_path, holder):
    paths = RunPaths(tmp_path / "run")
    with pytest.raises(LeaseHeld, match=f"pid {holder.pid}"):
        check_for_job(paths, "70", state=unreachable, wait_s=0.6)
