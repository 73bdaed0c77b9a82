"""Synthetic trace generators: shapes for tests and benchmarks (docs/reconstruction.md)."""
