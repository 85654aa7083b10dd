"""What the tests that hold prose to its sources share: a lecture's cells, its text as a reader sees it
(line breaks as spaces), a cell's stored output, and the records under notebooks/records."""
from __future__ import annotations

import json
import re

from conftest import REPO

RECORDS = REPO / "notebooks" / "records"


def cells(chapter):
    """The cells of lecture ``chapter`` ("02", "12", ...)."""
    path = next((REPO / "notebooks").glob(f"{chapter}_*.ipynb"))
    return json.loads(path.read_text())["cells"]


def cell(chapter, cell_id):
    return next(c for c in cells(chapter) if c.get("id") == cell_id)


def text(chapter, cell_id):
    """One cell's source, its line breaks and runs of spaces as one space."""
    return " ".join("".join(cell(chapter, cell_id)["source"]).split())


def markdown(chapter):
    """Every markdown cell of the lecture, as ``text`` gives each."""
    return " ".join(" ".join("".join(c["source"]).split()) for c in cells(chapter) if c["cell_type"] == "markdown")


def output_of(chapter, cell_id):
    """The text a code cell printed (its stored stream outputs)."""
    return "".join("".join(o.get("text", "")) for o in cell(chapter, cell_id).get("outputs", []))


def records(name, **match):
    """The records of ``notebooks/records/name`` (".jsonl" may be left off) whose fields equal ``match``."""
    path = RECORDS / (name if name.endswith(".jsonl") else f"{name}.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if all(r.get(k) == v for k, v in match.items())]


def quoted(pattern, where):
    """The groups of the sentence ``pattern`` in ``where``; fails, naming it, when the text lacks it."""
    found = re.search(pattern, where)
    assert found, f"the sentence /{pattern}/ is not in the text"
    return found.groups()
