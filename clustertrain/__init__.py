"""clustertrain — distributed LLM training on Slurm GPU clusters, rehearsed on one laptop."""

__version__ = "0.1.0"
