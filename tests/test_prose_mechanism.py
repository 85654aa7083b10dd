"""The prose tests catch the review's findings: each finding's cells, as they were before its fix, planted
back into the lecture (in memory: nothing is executed or written), make the test that holds that prose
fail; the same test passes on the lecture as it is.

``planted_prose.json`` holds the old cells and where they came from (``git show <rev>:<notebook>``,
the commit before each fix; chapters 13, 14 and 16's planted run from the commit this work started
on), and for each the test that must catch it.  Twenty of the plants are numbers that disagreed
with their output or record, the rest claims that no record held.
"""
import copy
import importlib
import json

import pytest

import lectures
from conftest import REPO

PLANTS = json.loads((REPO / "tests" / "planted_prose.json").read_text())


def _test_of(plant):
    module, name = plant["test"].split("::")
    fn = getattr(importlib.import_module(module), name)
    return (lambda: fn(plant["arg"])) if plant["arg"] is not None else fn


def _planted(monkeypatch, plant):
    """Make ``lectures.cells(chapter)`` return the lecture with the plant's old cells in place of the new."""
    real = lectures.cells
    lecture = copy.deepcopy(real(plant["chapter"]))
    ids = [c.get("id") for c in lecture]
    for old in plant["cells"]:
        assert old["id"] in ids, f"{plant['finding']}: cell {old['id']} is gone from the lecture"
        lecture[ids.index(old["id"])] = old
    monkeypatch.setattr(lectures, "cells", lambda chapter: lecture if chapter == plant["chapter"] else real(chapter))


def test_the_plants_cover_at_least_15_of_the_reviews_numeric_disagreements():
    assert sum(p["kind"] == "number" for p in PLANTS) >= 15
    majors = {p["finding"].split(":")[0] for p in PLANTS if p["finding"].startswith("major")}
    assert majors >= {f"major {n}" for n in range(3, 15)}   # majors 1-2 (fp8, ch11) are tested apart


@pytest.mark.parametrize("plant", PLANTS, ids=lambda p: p["finding"])
def test_the_lecture_as_it_is_passes(plant):
    _test_of(plant)()


@pytest.mark.parametrize("plant", PLANTS, ids=lambda p: p["finding"])
def test_the_old_text_planted_back_fails(plant, monkeypatch):
    _planted(monkeypatch, plant)
    with pytest.raises(AssertionError):
        _test_of(plant)()
