"""The run directory's contract: what the engine side writes and the offline side reads.

The recorder, the sources (importers, listener, generators, scenarios) and the reconstructor all
import this package; it imports none of them (docs/design.md §9). It holds the vocabulary, the
event schema and its column facts, batch framing, checksums, the manifest and the run writer.
"""
