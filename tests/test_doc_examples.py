"""Every example output in docs/explain.md, docs/sql.md and docs/after-an-incident.md is what
its command prints on the shipped traces (docs/examples.py; rewrite with
``python docs/examples.py``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _examples():
    spec = importlib.util.spec_from_file_location("doc_examples", REPO / "docs" / "examples.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["doc_examples"] = mod  # NOTE: dataclasses look their module up here
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def examples():
    return _examples()


@pytest.fixture(scope="module")
def outputs(examples):
    return examples.generate()


def test_every_doc_has_marked_examples(examples) -> None:
    for doc in examples.DOCS:
        assert examples.blocks(doc), doc


def test_every_doc_example_is_what_its_command_prints(examples, outputs) -> None:
    stale = examples.stale(outputs)
    assert not stale, [f"{b.doc}: {b.command}" for b in stale]


def test_a_changed_example_is_caught(examples, outputs) -> None:
    # negative twin: one character changed in a block's text makes it stale
    (key, text), = list(outputs.items())[:1]
    changed = {**outputs, key: text.replace("e", "E", 1)}
    assert [(b.doc, b.command) for b in examples.stale(changed)] == [key]
