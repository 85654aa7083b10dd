"""The classroom's pieces that need no hub: the hand-out rule, the CSV, and the recipes that cannot run here.

The recipes (Binder's environment.yml, the container image, the Kubernetes values) are read, not
run: no conda, docker daemon or cluster is needed.  What was tried beyond this is in
classroom/README.md; the hub itself is tests/test_classroom.py.
"""
from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
CLASSROOM = REPO / "classroom"
sys.path.insert(0, str(CLASSROOM))
import learner_start  # noqa: E402
import workshop  # noqa: E402

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")


def _pins():
    """{name: version} of pyproject's dependencies for Python >= 3.11, and of its test extra."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = {}
    for spec in project["dependencies"] + project["optional-dependencies"]["test"]:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)==([^;\s]+)(?:\s*;\s*(.*))?", spec)
        assert m, spec
        name, version, marker = m.groups()
        if marker is None or marker == "python_version >= '3.11'":
            pins[name.lower().replace("_", "-")] = version
    return pins


def test_environment_yml_has_pyprojects_pins():
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    got = {}
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            for spec in dep["pip"]:
                if "==" in spec:
                    name, version = spec.split("==")
                    got[name.lower().replace("_", "-")] = version
        elif "=" in dep:
            name, version = dep.split("=", 1)
            got[name.lower().replace("_", "-")] = version
    assert got.pop("python") == "3.11"
    assert got == _pins()
    assert "-e ." in next(d for d in env["dependencies"] if isinstance(d, dict))["pip"]  # course_lib itself


def test_the_image_and_kubernetes_values_agree_with_the_course():
    dockerfile = (CLASSROOM / "Dockerfile").read_text()
    values = yaml.safe_load((CLASSROOM / "kubernetes" / "values.yaml").read_text())
    # The image starts learners through the same learner_start.py as the one-machine hub.
    copied = dict(re.findall(r"^COPY (\S+) (\S+)$", dockerfile, re.M))
    start = values["singleuser"]["cmd"][-1]
    assert copied["classroom/learner_start.py"] == start
    assert re.search(rf'^CMD \["python", "-I", "{re.escape(start)}"\]$', dockerfile, re.M)
    # Nothing of solutions/ or tests/ goes into the image, nor into its build context.
    assert not any(src.startswith(("solutions", "tests")) for src in copied)
    ignore = [line for line in (CLASSROOM / "Dockerfile.dockerignore").read_text().splitlines()
              if line and not line.startswith("#")]
    assert ignore[0] == "*"  # everything out, then only what the image copies back in
    assert not any(line.startswith("!") and ("solutions" in line or "tests" in line) for line in ignore)
    # Its numba-cuda (and so its CUDA extra) is the course's.
    assert f'"numba-cuda[${{CUDA}}]=={_pins()["numba-cuda"]}"' in dockerfile
    # The page learners land on exists, here and on the one-machine hub.
    landing = values["singleuser"]["defaultUrl"]
    assert landing in (CLASSROOM / "jupyterhub_config.py").read_text()
    assert (REPO / landing.removeprefix("/lab/tree/")).exists()
    # The GPU profile asks for a GPU and the image built with CUDA.
    gpu = [p for p in values["singleuser"]["profileList"] if "GPU" in p["display_name"]]
    assert len(gpu) == 1
    override = gpu[0]["kubespawner_override"]
    assert override["extra_resource_limits"] == {"nvidia.com/gpu": "1"}
    assert override["image"].endswith("-cu12")


def test_hand_out_copies_what_is_missing_never_what_is_there(tmp_path):
    course, mine = tmp_path / "course", tmp_path / "home" / "flash-course"
    for rel in ("notebooks/01.ipynb", "notebooks/records/r.jsonl", "exercises/01.ipynb", "exercises/02.ipynb",
                "solutions/01.ipynb", "notebooks/.ipynb_checkpoints/01-checkpoint.ipynb"):
        (course / rel).parent.mkdir(parents=True, exist_ok=True)
        (course / rel).write_text(f"course {rel}")
    first = learner_start.hand_out(course, mine)
    assert sorted(map(str, first)) == ["exercises/01.ipynb", "exercises/02.ipynb", "notebooks/01.ipynb",
                                       "notebooks/records/r.jsonl"]  # no solutions, no checkpoints
    (mine / "exercises" / "01.ipynb").write_text("my answers")
    (mine / "exercises" / "02.ipynb").unlink()          # deleted: handed out again
    (course / "exercises" / "01.ipynb").write_text("course update")
    (course / "notebooks" / "03.ipynb").write_text("a new chapter")
    again = learner_start.hand_out(course, mine)
    assert sorted(map(str, again)) == ["exercises/02.ipynb", "notebooks/03.ipynb"]
    assert (mine / "exercises" / "01.ipynb").read_text() == "my answers"
    # A file where the course has a folder is the learner's: left alone, nothing copied under it.
    shutil.rmtree(mine / "notebooks" / "records")
    (mine / "notebooks" / "records").write_text("mine")
    assert learner_start.hand_out(course, mine) == []
    assert (mine / "notebooks" / "records").read_text() == "mine"


def test_a_reason_in_the_class_csv_is_never_a_formula():
    for text in ("=HYPERLINK(\"http://x\")", "+1", "-1", "@SUM(A1)", "\tx"):
        assert workshop.spreadsheet_safe(text) == "'" + text
    assert workshop.spreadsheet_safe("not implemented yet") == "not implemented yet"
    assert workshop.spreadsheet_safe("") == ""
