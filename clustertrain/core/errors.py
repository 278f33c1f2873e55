"""Error types. A :class:`ClusterTrainError` is a mistake the user can fix: the CLI prints its
message as one line and exits 2. Anything else is a bug in clustertrain and keeps its traceback."""

from __future__ import annotations


class ClusterTrainError(Exception):
    """Root of every error a user can fix. The message is one line naming the file/field and the fix."""

    exit_code = 2


class ConfigError(ClusterTrainError):
    """The project file (or a ``--set`` override) is wrong."""


class DataError(ClusterTrainError):
    """Input data, a dataset file or a manifest is wrong or damaged."""


class RunDirError(ClusterTrainError):
    """A run directory cannot be used as asked (another project's checkpoints, ...)."""


class StorageError(ClusterTrainError):
    """An object store cannot be used as asked (unknown scheme, missing bucket, no credentials...)."""


class LaunchError(ClusterTrainError):
    """A job cannot be launched or tracked as asked."""


class ImageError(ClusterTrainError):
    """The training image cannot be rendered, built or checked as asked (bad pin, missing tool, existing image...)."""


class TrainingError(ClusterTrainError):
    """Training itself went wrong in a way a person must act on (a non-finite loss): the run stops with one line
    naming the step and the last good checkpoint. Exit 1: the input was fine, the run failed."""

    exit_code = 1


class CloudError(ClusterTrainError):
    """AWS refused or failed an operation on the project's behalf (a stack rolled back, a change set would replace a
    bucket, ``pcluster`` rejected the config, no credentials): one line naming the resource, the reason and the fix."""
