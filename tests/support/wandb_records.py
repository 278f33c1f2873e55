"""Reading back what W&B wrote offline, for the tests: the product's reader,
:mod:`clustertrain.monitor.wandb_files` (the ``.wandb`` framing and W&B's own protobuf records)."""

from clustertrain.monitor.wandb_files import held_steps, history, offline_runs, records, run_record

__all__ = ["held_steps", "history", "offline_runs", "records", "run_record"]
