"""The formats and vocabulary more than one stage reads, torch-free (see docs/architecture.md)."""
