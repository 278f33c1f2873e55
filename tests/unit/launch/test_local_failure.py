"""Which failed rank the local launcher names when several have exited by the time it looks.

The logs are written here by the test. Rank 0's last line ends as the message torch 2.13's gloo backend raised
in this project's CI when a peer died in a collective (its tail as CI printed it; the head is abridged): rank 0,
blocked in an all-reduce, exited within the same poll as rank 1, which had crashed first, and was named."""

from __future__ import annotations

from types import SimpleNamespace

from clustertrain.launch.local import _cause, _describe_failure
from clustertrain.core.run_paths import RunPaths

GLOO_PEER = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
             "[127.0.0.1]:29500. This is typically caused by a remote worker crashing. Check the logs of the remote "
             "worker before reporting an error. GLHF! \U0001f3d6\ufe0f")


def spec_with_logs(tmp_path, logs: dict[int, str]):
    paths = RunPaths(tmp_path / "run")
    paths.logs.mkdir(parents=True)
    for rank, text in logs.items():
        paths.rank_log(rank).write_text(text)
    return SimpleNamespace(paths=paths)


def test_the_rank_that_crashed_is_named_not_the_peer_it_took_down(tmp_path):
    spec = spec_with_logs(tmp_path, {0: f"step 4 loss 5.1\n{GLOO_PEER}\n",
                                     1: "step 4 loss 5.1\nRuntimeError: injected failure at step 5\n"})
    assert _cause(spec, [(0, 1), (1, 1)]) == (1, 1)
    message = _describe_failure(spec, *_cause(spec, [(0, 1), (1, 1)]))
    assert message.startswith("rank 1 exited with code 1") and "injected failure at step 5" in message


def test_without_a_peer_message_the_first_failed_rank_is_named(tmp_path):
    spec = spec_with_logs(tmp_path, {0: "MemoryError\n", 1: f"{GLOO_PEER}\n"})
    assert _cause(spec, [(0, -9), (1, 1)]) == (0, -9)
    both = spec_with_logs(tmp_path / "b", {0: f"{GLOO_PEER}\n", 1: f"{GLOO_PEER}\n"})
    assert _cause(both, [(0, 1), (1, 1)]) == (0, 1)
