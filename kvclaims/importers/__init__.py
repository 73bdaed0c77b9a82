"""Importers: foreign traces and interchange formats into run directories (docs/trace-format.md)."""
