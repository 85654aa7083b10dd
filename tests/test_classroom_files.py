"""The classroom's pieces that need no hub: the hand-out rule, the CSVs and the gradebook, the
start's settings and address, the search for readable solutions, and the recipes that cannot run here.

The recipes (Binder's environment.yml, the container image, the Kubernetes values) are read, not
run: no conda, docker daemon or cluster is needed.  What was tried beyond this is in
classroom/README.md; the hub itself is tests/test_classroom.py.
"""
from __future__ import annotations

import json
import re
import shutil
import socket
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from conftest import REPO

CLASSROOM = REPO / "classroom"
sys.path.insert(0, str(CLASSROOM))
import coursework  # noqa: E402
import learner_start  # noqa: E402
import machine  # noqa: E402
import service  # noqa: E402

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


def test_the_gpu_image_is_pulled_on_the_tainted_gpu_nodes():
    values = yaml.safe_load((CLASSROOM / "kubernetes" / "values.yaml").read_text())
    gpu = next(p for p in values["singleuser"]["profileList"] if "GPU" in p["display_name"])["kubespawner_override"]
    puller = values["prePuller"]
    # The chart's image puller pulls the profiles' images, and runs on a node only if it tolerates
    # the node's taints: every toleration the GPU pods need, the puller has.
    assert puller["pullProfileListImages"] is True and puller["continuous"]["enabled"] is True
    tolerated = puller.get("extraTolerations", []) + values["singleuser"].get("extraTolerations", [])
    assert gpu["tolerations"] and all(t in tolerated for t in gpu["tolerations"]), (gpu["tolerations"], tolerated)


def test_nativeauthenticators_pages_are_on_the_hubs_template_path(tmp_path, monkeypatch):
    values = yaml.safe_load((CLASSROOM / "kubernetes" / "values.yaml").read_text())
    assert values["hub"]["config"]["JupyterHub"]["authenticator_class"] == "native"
    # Run the hub's extra config against a stand-in package where the chart's image has it.
    package = tmp_path / "nativeauthenticator"
    (package / "templates").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "nativeauthenticator", raising=False)

    class Section(dict):
        __getattr__ = dict.__getitem__
        __setattr__ = dict.__setitem__

    c = type("Config", (), {"JupyterHub": Section()})()
    for snippet in values["hub"]["extraConfig"].values():
        exec(snippet, {"c": c})
    assert [Path(p).resolve() for p in c.JupyterHub["template_paths"]] == [package / "templates"]


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
        assert coursework.spreadsheet_safe(text) == "'" + text
    assert coursework.spreadsheet_safe("not implemented yet") == "not implemented yet"
    assert coursework.spreadsheet_safe("") == ""


def test_a_handed_out_notebook_carries_the_kernels_python_version(tmp_path):
    # JupyterLab replaces an open notebook's language_info with the kernel's and marks it modified
    # if anything differs, so the copy must say the learners' Python (the one running the hand-out).
    course, mine = tmp_path / "course", tmp_path / "mine"
    (course / "notebooks").mkdir(parents=True)
    committed = (REPO / "notebooks" / "00_start_here.ipynb").read_text()
    nb = json.loads(committed)
    nb["metadata"]["language_info"]["version"] = "3.0.1"
    (course / "notebooks" / "00.ipynb").write_text(json.dumps(nb, sort_keys=True, indent=1, ensure_ascii=False) + "\n")
    (course / "notebooks" / "records.jsonl").write_text('{"version": "3.0.1"}\n')
    learner_start.hand_out(course, mine)
    got = json.loads((mine / "notebooks" / "00.ipynb").read_text())
    assert got["metadata"]["language_info"]["version"] == sys.version.split()[0] == learner_start.kernel_python_version()
    got["metadata"]["language_info"]["version"] = "3.0.1"
    assert got == nb  # nothing else changed
    assert (mine / "notebooks" / "records.jsonl").read_text() == '{"version": "3.0.1"}\n'  # not a notebook


def test_the_lab_overrides_answer_the_news_question_never():
    overrides = json.loads((CLASSROOM / "overrides.json").read_text())
    schemas = Path(sys.prefix) / "share" / "jupyter" / "lab" / "schemas"
    for plugin, values in overrides.items():
        package, name = plugin.split(":")
        schema = json.loads((schemas / package / f"{name}.json").read_text())
        for key, value in values.items():
            spec = schema["properties"][key]  # a setting JupyterLab has
            allowed = [c["const"] for c in spec.get("oneOf", [])] or None
            assert allowed is None or value in allowed, (plugin, key, value, allowed)
            assert isinstance(value, {"boolean": bool, "string": str, "number": (int, float)}[spec["type"]])
    # "none" (ask) is what makes JupyterLab pop the question up; "false" is Never.
    assert overrides["@jupyterlab/apputils-extension:notification"]["fetchNews"] == "false"
    # The image puts them where JupyterLab reads overrides: <sys.prefix>/share/jupyter/lab/settings/.
    dockerfile = (CLASSROOM / "Dockerfile").read_text()
    assert "COPY classroom/overrides.json /opt/venv/share/jupyter/lab/settings/overrides.json" in dockerfile
    assert "!classroom/overrides.json" in (CLASSROOM / "Dockerfile.dockerignore").read_text()


def test_a_bare_start_keeps_the_last_starts_options():
    first = service.start_settings({"root": "/x", "group": "g"}, {"ip": "10.0.0.5", "port": 9000})
    assert first == {"root": "/x", "group": "g", "ip": "10.0.0.5", "port": 9000, "hub_port": 8081,
                     "proxy_api_port": 8001}
    bare = service.start_settings(dict(first, instructors=["teach"]), dict.fromkeys(service.START_DEFAULTS))
    assert bare == dict(first, instructors=["teach"])
    assert service.start_settings(bare, {"port": 8000})["ip"] == "10.0.0.5"


def test_every_interface_is_printed_as_this_machines_address():
    urls = service.public_urls({"ip": "0.0.0.0", "port": 8000})
    assert urls and all(u.startswith("http://") for u in urls)
    hosts = [u.split("//")[1].split(":")[0] for u in urls]
    if not hosts[0].startswith("127."):  # a machine with a name or an address beyond the loopback
        assert not any(h.startswith("127.") or h == "0.0.0.0" for h in hosts), hosts
        assert socket.getfqdn() in hosts or any(h[0].isdigit() for h in hosts), hosts
    assert service.public_urls({"ip": "10.1.2.3", "port": 81}) == ["http://10.1.2.3:81"]
    assert service.local_url({"ip": "0.0.0.0", "port": 8000}) == "http://127.0.0.1:8000"


@pytest.mark.needs_root("the search runs as an unprivileged account")
def test_every_copy_of_the_solutions_a_learner_could_read_is_named():
    top = Path(tempfile.mkdtemp(prefix="flash-seek-", dir="/tmp"))
    try:
        top.chmod(0o755)

        def clone(name, solutions_mode=0o755, git=True, tests=True):
            base = top / name
            (base / "course_lib").mkdir(parents=True)
            (base / "solutions").mkdir()
            (base / "solutions" / "01_naive_attention.ipynb").write_text("{}")
            if git:
                (base / ".git").mkdir()
                (base / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
            if tests:
                (base / "tests").mkdir()
                (base / "tests" / "test_exercise_checks_01_07.py").write_text("")
            for path in base.rglob("*"):
                path.chmod(0o755 if path.is_dir() else 0o644)
            base.chmod(0o755)
            (base / "solutions").chmod(solutions_mode)
            return base

        readable = clone("readable")
        locked = clone("locked", solutions_mode=0o700, git=False, tests=False)   # chmod 700 solutions/
        hidden = top / "hidden"
        hidden.mkdir(mode=0o700)
        hidden.chmod(0o700)
        shutil.copytree(readable, hidden / "clone")                                # under a private folder
        stray = top / "downloads" / "solutions"
        stray.mkdir(parents=True)
        (stray / "02_roofline.ipynb").write_text("{}")                            # a lone copy, no clone
        for path in (top / "downloads", stray):
            path.chmod(0o755)
        (stray / "02_roofline.ipynb").chmod(0o644)
        (stray / "notes.txt").write_text("")
        found = dict(machine.readable_solutions("no-such-group", machine.default_python(), roots=[top]))
        assert found == {
            str(readable / "solutions"): "the solutions (01_naive_attention.ipynb can be read)",
            str(readable / ".git"): "the course's git history, which holds the solutions",
            str(readable / "tests"): "the exercise tests, which quote the solutions",
            str(stray): "the solutions (02_roofline.ipynb can be read)",
        }, found
        assert str(locked / "solutions") not in found and not any(str(hidden) in p for p in found)
    finally:
        shutil.rmtree(top)


def test_a_notebook_changed_after_the_deadline_is_late_whatever_its_mtime_says():
    due = datetime(2026, 12, 2, 17, 0, tzinfo=timezone.utc)
    before, after = due.timestamp() - 60, due.timestamp() + 60
    on_time = coursework.submission_row("ada", b"{}", {"mtime": before, "ctime": before}, due)
    assert (on_time["status"], on_time["late"], on_time["changed_at"]) == ("collected", "no", "2026-12-02T16:59:00Z")
    # `touch -d` set the mtime back; the ctime (set by the kernel, never back) says when it changed.
    backdated = coursework.submission_row("bob", b"{}", {"mtime": before, "ctime": after}, due)
    assert backdated["late"] == "yes" and backdated["saved_at"] == "2026-12-02T16:59:00Z"
    assert coursework.submission_row("cy", b"{}", {"mtime": after, "ctime": after}, None)["late"] == ""
    missing = coursework.submission_row("dee", None, None, due, "not a regular file")
    assert (missing["status"], missing["late"], missing["reason"]) == ("missing", "", "not a regular file")
    # A deadline without an offset is this machine's local time; one with an offset is that.
    assert coursework.parse_deadline("2026-12-02T18:00+01:00") == due
    local = coursework.parse_deadline("2026-12-02T17:00")
    assert local.utcoffset() == local.astimezone().utcoffset()
    with pytest.raises(coursework.BadSheet, match="is not a date and time"):
        coursework.parse_deadline("tomorrow")


def _grade_rows(learner, points, set_="01_x", out_of=(("1.1", 2), ("1.2", 3))):
    return [dict(learner=learner, exercise_set=set_, exercise=ex, status="pass" if p else "fail", points=str(p),
                 max_points=str(m), reason="") for (ex, m), p in zip(out_of, points)]


def test_the_gradebook_adds_every_set_the_late_flags_and_the_hand_marks(tmp_path):
    grades = {"01_x": _grade_rows("ada", [2, 3]) + _grade_rows("bob", [0, 3]),
              "02_y": _grade_rows("ada", [1], "02_y", (("2.1", 1),))}
    submissions = {"01_x": [{"learner": "ada", "late": "no"}, {"learner": "bob", "late": "yes"}]}
    sheet = [{"learner": "bob", "exercise_set": "01_x", "exercise": "1.9", "points": "1.5", "max_points": "2",
              "comment": "the tile is right; the traffic argument is missing"}, dict.fromkeys(coursework.MANUAL_COLUMNS, "")]
    manual = coursework.manual_marks(sheet, ["ada", "bob"], {"01_x": {}, "02_y": {}})
    columns, rows = coursework.gradebook(["ada", "bob"], grades, submissions, manual)
    assert columns == ["learner", "01_x (/5)", "01_x late", "02_y (/1)", "02_y late", "manual", "manual max",
                       "total", "max_points"]
    assert rows == [
        {"learner": "ada", "01_x (/5)": "5", "01_x late": "no", "02_y (/1)": "1", "02_y late": "", "manual": "0",
         "manual max": "0", "total": "6", "max_points": "6"},
        {"learner": "bob", "01_x (/5)": "3", "01_x late": "yes", "02_y (/1)": "", "02_y late": "", "manual": "1.5",
         "manual max": "2", "total": "4.5", "max_points": "8"},
    ]
    coursework.write_csv(tmp_path / "gradebook.csv", columns, rows)
    assert coursework.read_csv(tmp_path / "gradebook.csv") == rows
    # The hand marks reach the learner's feedback, with the comment, and so does lateness.
    text = coursework.feedback_text("01_x", grades["01_x"][2:], "2026-12-02 18:00 UTC", manual,
                                    {"status": "collected", "deadline": "2026-12-02T17:00:00Z",
                                     "changed_at": "2026-12-02T17:01:00Z", "late": "yes"})
    assert text.startswith("Feedback on exercise set 01_x: 4.5 / 7 points")
    assert "LATE" in text and "by hand" in text and "the traffic argument is missing" in text


@pytest.mark.parametrize("row, message", [
    ({"learner": "eve", "exercise_set": "01_x", "points": "1", "max_points": "2"}, "'eve' is not a learner"),
    ({"learner": "ada", "exercise_set": "09_z", "points": "1", "max_points": "2"}, "'09_z' is not an exercise set"),
    ({"learner": "ada", "exercise_set": "01_x", "points": "two", "max_points": "2"}, "must be numbers"),
    ({"learner": "ada", "exercise_set": "01_x", "points": "3", "max_points": "2"}, "not between 0 and max_points"),
])
def test_a_hand_mark_that_cannot_be_used_names_its_row(row, message):
    rows = [{"learner": "ada", "exercise_set": "01_x", "exercise": "1.9", "points": "1", "max_points": "1"},
            dict(dict.fromkeys(coursework.MANUAL_COLUMNS, ""), exercise="1.9", **row)]
    with pytest.raises(coursework.BadSheet, match=f"manual.csv row 3: .*{re.escape(message)}"):
        coursework.manual_marks(rows, ["ada"], {"01_x": {}})
