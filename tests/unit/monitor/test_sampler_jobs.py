"""The node sampler beside jobs that share a node (issue 42): one set of files per job's run directory, and a start
line naming the job and the node's GPUs it was given."""

from __future__ import annotations

from clustertrain.core.run_paths import RunPaths
from clustertrain.monitor.gpus import NoGpus
from clustertrain.monitor.sampler import Sampler, job_scope, run


def test_two_jobs_on_one_node_write_two_files(tmp_path):
    node = "gpu-queue-st-p5e-48xlarge-3"
    runs = [RunPaths(tmp_path / "proj" / model) for model in ("model-b", "model-c")]  # one run dir per model
    for paths in runs:
        paths.monitor.mkdir(parents=True)
        sampler = Sampler(paths, node, 90.0, NoGpus())
        sampler.sample()
        sampler.close()
    files = [paths.node_samples(node) for paths in runs]
    assert files[0] != files[1]
    for f in files:
        lines = f.read_text().splitlines()
        assert len(lines) == 2 and lines[0].startswith("timestamp,")  # its header and its own one sample


def test_start_line_names_the_job_and_its_gpus(tmp_path, capsys, monkeypatch):
    env = {"SLURM_JOB_ID": "10007", "SLURM_JOB_GPUS": "4,5,6,7", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert job_scope(env) == ", job 10007 (node GPUs 4,5,6,7; CUDA_VISIBLE_DEVICES=0,1,2,3)"
    assert job_scope({"SLURM_JOB_ID": "5"}) == ", job 5"
    assert job_scope({"CUDA_VISIBLE_DEVICES": "0"}) == ""  # not a Slurm job
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    paths = RunPaths(tmp_path / "run")
    paths.monitor.mkdir(parents=True)
    assert run(paths, "node1", 0.05, 90.0, parent=-1) == 0  # parent "gone" at once: start line, stop line
    out = capsys.readouterr().out
    assert "job 10007 (node GPUs 4,5,6,7; CUDA_VISIBLE_DEVICES=0,1,2,3)" in out.splitlines()[0]


def test_gpus_of_another_job_on_the_node_are_not_sampled():
    """NVML counts every GPU of the node (nvmlDeviceGetCount_v2) but may not open the ones Slurm's device cgroup
    keeps from this job (NVML_ERROR_NO_PERMISSION): those are left out; a lost GPU (another error) keeps its place."""
    import pynvml

    from clustertrain.monitor.gpus import GpuReading, open_gpus
    from tests.unit.monitor.test_sampler import GOOD, FakeNvml

    class SharedNodeNvml(FakeNvml):
        def __init__(self, devices, denied, lost=()):
            super().__init__(devices)
            self.denied, self.lost = set(denied), set(lost)

        def nvmlDeviceGetHandleByIndex(self, i):
            if i in self.denied:
                raise pynvml.NVMLError_NoPermission()
            if i in self.lost:
                raise pynvml.NVMLError_GpuIsLost()
            return i

    devices = [{**GOOD, "temperature": 40 + i} for i in range(8)]
    nvml = SharedNodeNvml(devices, denied={0, 1, 2, 3}, lost={6})  # this job holds GPUs 4-7 of the node; 6 fell off
    gpus, found = open_gpus(nvml)
    assert gpus.count() == 4 and found == "4 GPU(s) through NVML (4 more on the node, another job's)"
    assert [gpus.read(i).temperature_c for i in range(4)] == [44, 45, None, 47]
    assert gpus.read(2) == GpuReading()  # the lost GPU: empty cells, its place kept
    nvml.queue = [(5, 79), (7, 48)]  # XID events name NVML's index: rows and events use ours
    assert gpus.wait_xid(0.5) == [(1, 79), (3, 48)]
    gpus.close()
    all_denied, found = open_gpus(SharedNodeNvml(devices, denied=range(8)))
    assert all_denied.count() == 0 and "all another job's" in found
