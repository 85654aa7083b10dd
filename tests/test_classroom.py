"""A workshop on JupyterHub, end to end: two real learners, their work, grades, feedback, isolation.

Everything goes through the instructor's commands (``classroom/workshop.py``) and the learners'
side of the hub (its login form, its REST API, the Jupyter server API of each learner's server,
a real browser): install the learners' course and venv, make two system accounts, start the hub
on 127.0.0.1, spawn both servers, run chapter 01's first cells in each (and the whole chapter
under nbval in one), have each save a different exercise answer, try to reach the other's files
and the instructor's, update the course, collect hostile folders, grade into one CSV, hand back
feedback, stop, and check that no process of the hub, the proxy or either learner is left.

It needs root (it makes accounts with useradd and the hub starts servers as them), npm (the
hub's proxy comes from npm), bubblewrap (the grader's sandbox) and a Python that unprivileged
accounts can run (the learners' venv is built on it); without one it is skipped and says which.
The learners' venv is cached in /tmp between runs (keyed on this checkout's path), so a second
run skips the pip install of about a minute.
"""
from __future__ import annotations

import csv
import grp
import hashlib
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import CHROMIUM, CHROMIUM_ARGS, REPO

sys.path.insert(0, str(REPO / "classroom"))
import coursework  # the instructor's commands; stdlib only
import machine
import service

SET = "01_naive_attention"
SPAWN_S = 180
ARTIFACTS = REPO / "test-artifacts"


def _why_skip():
    if sys.platform != "linux":
        return "needs Linux (system accounts, /proc)"
    if os.geteuid() != 0:
        return "needs root: it makes system accounts with useradd and the hub starts a server as each"
    missing = [t for t in ("useradd", "userdel", "groupadd", "groupdel", "chpasswd", "npm", "node", "bwrap")
               if not shutil.which(t)]
    if missing:
        return (f"{', '.join(missing)} not found (Debian: apt-get install passwd nodejs npm bubblewrap; "
                ".ci/run does)")
    why = machine.runs_as_nobody([machine.default_python(), "-c", "import venv, ensurepip"])
    if why:
        return (f"no Python that unprivileged accounts can run for the learners' venv "
                f"({machine.default_python()}: {why}; Debian: apt-get install python3-venv)")
    return None


pytestmark = [pytest.mark.skipif(_why_skip() is not None, reason=f"hub test skipped: {_why_skip()}"),
              pytest.mark.timeout(900)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CACHE_PREFIX = "flash-course-hub-test-"
CACHE_KEPT_S = 3600


def _root() -> Path:
    """A root-owned folder in /tmp that learners can traverse, the same for every run of this checkout.

    Another checkout's folder (each holds a venv of about 850 MB) that no test has used for an
    hour and that has no hub state (none running) is removed, so clones do not pile up in /tmp.
    """
    root = Path("/tmp") / f"{CACHE_PREFIX}{hashlib.sha256(str(REPO).encode()).hexdigest()[:10]}"
    for other in Path("/tmp").glob(f"{CACHE_PREFIX}*"):
        st = other.lstat()
        if (other != root and stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and not (other / "state").exists()
                and time.time() - st.st_mtime > CACHE_KEPT_S):
            shutil.rmtree(other, ignore_errors=True)
    if root.exists():
        st = root.lstat()
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
            shutil.rmtree(root) if stat.S_ISDIR(st.st_mode) else root.unlink()
    root.mkdir(mode=0o755, exist_ok=True)
    os.utime(root)  # in use
    return root


def _workshop(root, *args, timeout=600):
    done = subprocess.run([sys.executable, str(REPO / "classroom" / "workshop.py"), "--root", str(root), *args],
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"workshop.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _alive(pid: int) -> bool:
    return bool(machine.cmdline(pid))


class Hub:
    def __init__(self, root, url, passwords, group, instructor):
        self.root, self.url, self.group = root, url, group
        self.names = sorted(passwords)  # the learners
        self.teacher = next(iter(instructor))
        self.passwords = {**passwords, **instructor}
        self.tokens = {}

    # -- a learner's side of the hub --------------------------------------------------------
    def login(self, name):
        """Log in through the login form (as a browser does); the hub spawns their server."""
        import requests
        s = requests.Session()
        s.get(f"{self.url}/hub/login", timeout=60).raise_for_status()
        r = s.post(f"{self.url}/hub/login", data={"username": name, "password": self.passwords[name],
                                                   "_xsrf": s.cookies.get("_xsrf")}, timeout=SPAWN_S)
        assert r.status_code == 200 and "/hub/login" not in r.url, f"login of {name} failed: {r.status_code} {r.url}"
        return s

    def refused(self, name, password) -> bool:
        """Whether the login form turns ``name`` with ``password`` away."""
        import requests
        s = requests.Session()
        s.get(f"{self.url}/hub/login", timeout=60).raise_for_status()
        r = s.post(f"{self.url}/hub/login", data={"username": name, "password": password,
                                                   "_xsrf": s.cookies.get("_xsrf")}, timeout=60)
        return r.status_code == 403 and "/hub/login" in r.url and "Invalid username or password" in r.text

    def token(self, name):
        """An API token of the learner's own (asked for with their login cookie)."""
        if name not in self.tokens:
            s = self.login(name)
            r = s.post(f"{self.url}/hub/api/users/{name}/tokens", json={"note": "hub test", "expires_in": 3600},
                       headers={"X-XSRFToken": s.cookies.get("_xsrf", path="/hub/")}, timeout=60)
            assert r.status_code == 201, (r.status_code, r.text)
            self.tokens[name] = r.json()["token"]
        return self.tokens[name]

    def api(self, name, method, path, as_=None, **kwargs):
        """Call the hub's (``/hub/api/...``) or a learner's server's (``/user/NAME/api/...``) REST API."""
        import requests
        headers = {"Authorization": f"token {self.token(as_ or name)}"}
        return requests.request(method, f"{self.url}{path}", headers=headers, timeout=120, **kwargs)

    def wait_ready(self, name):
        deadline = time.monotonic() + SPAWN_S
        while time.monotonic() < deadline:
            r = self.api(name, "GET", f"/hub/api/users/{name}")
            server = r.json().get("servers", {}).get("", {})
            if server.get("ready"):
                return
            if not server.get("pending"):  # neither running nor starting: start it
                self.api(name, "POST", f"/hub/api/users/{name}/server")
            time.sleep(1)
        pytest.fail(f"{name}'s server was not ready within {SPAWN_S} s:\n{service.log_tail(machine.Place(self.root))}")

    def session(self, name, path):
        """A notebook session of the learner's on ``path`` (its kernel's cwd is the notebook's folder); its kernel id."""
        r = self.api(name, "POST", f"/user/{name}/api/sessions",
                     json={"path": path, "type": "notebook", "kernel": {"name": "python3"}})
        assert r.status_code == 201, (r.status_code, r.text)
        return r.json()["kernel"]["id"]

    def run(self, name, kernel_id, code, timeout=120):
        """Execute ``code`` in the learner's kernel through the server's websocket; (stdout text, error or None)."""
        import websocket
        ws = websocket.create_connection(f"ws{self.url[4:]}/user/{name}/api/kernels/{kernel_id}/channels",
                                         header=[f"Authorization: token {self.token(name)}"], timeout=timeout)
        try:
            msg_id = uuid.uuid4().hex
            ws.send(json.dumps({"header": {"msg_id": msg_id, "username": name, "session": uuid.uuid4().hex,
                                           "msg_type": "execute_request", "version": "5.3", "date": ""},
                                "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
                                "content": {"code": code, "silent": False, "store_history": True,
                                            "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}}))
            out, error = [], None
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                msg = json.loads(ws.recv())
                if msg.get("parent_header", {}).get("msg_id") != msg_id or msg.get("channel") != "iopub":
                    continue
                kind, content = msg["msg_type"], msg["content"]
                if kind == "stream":
                    out.append(content["text"])
                elif kind in ("execute_result", "display_data"):
                    out.append(content["data"].get("text/plain", "") + "\n")
                elif kind == "error":
                    error = f"{content['ename']}: {content['evalue']}"
                elif kind == "status" and content["execution_state"] == "idle":
                    return "".join(out), error
            pytest.fail(f"{name}'s kernel did not finish within {timeout} s")
        finally:
            ws.close()


# An error line of the hub itself (not of a learner's server, which logs to the same file).
HUB_ERROR = re.compile(r"^\[E \S+ \S+ JupyterHub .*$", re.M)

# The version of Python chapter 00 says it was authored on, in the installed course: not the
# learners' (their venv's), so the hand-out must rewrite it or JupyterLab marks the notebook modified.
AUTHORED_ON = "3.0.1"


@pytest.fixture(scope="module")
def hub():
    tag = secrets.token_hex(3)
    group = f"fht{tag}"
    names = [f"fht{tag}-ada", f"fht{tag}-bob"]
    teacher = f"fht{tag}-teach"
    root = _root()
    shutil.rmtree(root / "state", ignore_errors=True)
    place = machine.Place(root)
    try:
        _workshop(root, "install", "--group", group, timeout=900)
        start_here = root / "course" / "notebooks" / "00_start_here.ipynb"
        nb = json.loads(start_here.read_text())
        assert nb["metadata"]["language_info"]["version"] != AUTHORED_ON
        nb["metadata"]["language_info"]["version"] = AUTHORED_ON
        start_here.write_text(json.dumps(nb, sort_keys=True, indent=1, ensure_ascii=False) + "\n")
        out = _workshop(root, "add-learners", *names)
        passwords = dict(re.findall(r"^(fht\S+)\t(\S+)$", out, re.M))
        assert sorted(passwords) == names, out
        out = _workshop(root, "add-instructor", teacher)
        instructor = dict(re.findall(r"^(fht\S+)\t(\S+)$", out, re.M))
        assert list(instructor) == [teacher], out
        port = _free_port()
        _workshop(root, "start", "--ip", "127.0.0.1", "--port", str(port), "--hub-port", str(_free_port()),
                  "--proxy-api-port", str(_free_port()), "--accept-readable-solutions")
        yield Hub(root, f"http://127.0.0.1:{port}", passwords, group, instructor)
    finally:  # whatever happened: no hub, no proxy, no account, no process left
        subprocess.run([sys.executable, str(REPO / "classroom" / "workshop.py"), "--root", str(root), "stop"],
                       capture_output=True, timeout=300)
        for pid in (service.hub_pid(place), service.proxy_pid(place)):
            if pid:
                os.kill(pid, signal.SIGKILL)
        for name in names + [teacher]:
            try:
                uid = pwd.getpwnam(name).pw_uid
            except KeyError:
                continue
            for p in machine.pids_of_uid(uid):
                os.kill(p, signal.SIGKILL)
            subprocess.run(["userdel", "--remove", name], capture_output=True)
        subprocess.run(["groupdel", group], capture_output=True)
        shutil.rmtree(root / "state", ignore_errors=True)  # passwords, database, collected work
        shutil.rmtree(root / "left-behind-clone", ignore_errors=True)


def _solution_answers():
    """{exercise: [(answer cell id, solution source)]} of the set, from solutions/."""
    nb = json.loads((REPO / "solutions" / f"{SET}.ipynb").read_text())
    out = {}
    for cell in nb["cells"]:
        if "answer" in cell["metadata"].get("tags", []):
            out.setdefault(cell["metadata"]["course"]["exercise"], []).append((cell["id"], "".join(cell["source"])))
    return out


def _points():
    return dict(coursework._exercises(SET))


# What each learner solves: different answers, different scores.
SOLVES = {"ada": ["1.1", "1.2", "1.3", "1.4", "1.5", "1.6", "1.7", "1.8"], "bob": ["1.1", "1.5"]}  # ada: all of set 01

# Run in a learner's kernel: what it can read and write of the other's and the instructor's.
PROBE = r"""
import json, os
def attempt(what, path, mode):
    try:
        if mode == "list":
            os.listdir(path)
        elif mode == "read":
            open(path, "rb").read(1)
        else:
            with open(path, "ab"):
                pass
        return "allowed"
    except PermissionError:
        return "denied"
    except OSError as exc:
        return type(exc).__name__
found = {k: attempt(k, p, m) for k, (p, m) in json.loads(%r).items()}
print("PROBE " + json.dumps(found, sort_keys=True))
"""


def _probe(hub, name, kernel, targets):
    out, error = hub.run(name, kernel, PROBE % json.dumps(targets))
    assert error is None, error
    return json.loads(re.search(r"^PROBE (.*)$", out, re.M).group(1))


@pytest.mark.needs_chromium
def test_a_learner_logs_in_in_chromium_and_chapter_00_opens(hub):
    sync_api = pytest.importorskip("playwright.sync_api", reason="browser part skipped: playwright missing")
    name = hub.names[0]
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(SPAWN_S * 1000)
            page.goto(f"{hub.url}/hub/login")
            page.fill("#username_input", name)
            page.fill("#password_input", hub.passwords[name])
            page.click("#login_submit")
            # The hub spawns the server, then sends the browser to the course's start page.
            page.wait_for_url(re.compile(rf"/user/{name}/lab/tree/notebooks/00_start_here\.ipynb"))
            heading = page.locator(".jp-Notebook .jp-RenderedMarkdown h1", has_text="Start here").first
            try:
                heading.wait_for(state="visible")
            except sync_api.TimeoutError:
                page.screenshot(path=str(ARTIFACTS / "hub_chapter_00_timeout.png"), full_page=True)
                raise
            page.screenshot(path=str(ARTIFACTS / "hub_chapter_00.png"))
            assert "00 · Start here" in heading.inner_text()
            # ... with the course's kernel (the venv's "python3", as `make lab` registers it).
            page.locator(".jp-Toolbar", has_text="Python 3 (FlashAttention course)").first.wait_for(state="visible")
            # Once the kernel is up, JupyterLab has written its language_info into the notebook: the
            # tab is still unmodified (the course says it was authored on another Python, AUTHORED_ON).
            page.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]').first.wait_for(state="attached")
            time.sleep(3)  # long enough for the news question, which comes once the page is restored
            page.screenshot(path=str(ARTIFACTS / "hub_chapter_00_idle.png"))
            tab = page.locator(".lm-TabBar-tab", has_text="00_start_here.ipynb").first
            assert "jp-mod-dirty" not in (tab.get_attribute("class") or ""), "chapter 00 opened as modified"
            # No "Would you like to get notified about official Jupyter news?" toast.
            assert page.get_by_text("official Jupyter news").count() == 0
        finally:
            browser.close()


def test_two_learners_work_alone_and_are_graded_in_one_command(hub):
    ada, bob = hub.names
    who = {ada: "ada", bob: "bob"}
    answers = _solution_answers()
    points = _points()
    kernels = {}
    chapter01 = json.loads((REPO / "notebooks" / "01_naive_attention.ipynb").read_text())
    first, second = [c for c in chapter01["cells"] if c["cell_type"] == "code"][:2]
    stored = "".join("".join(o["text"]) for o in second["outputs"] if o["output_type"] == "stream")
    for name in hub.names:
        hub.wait_ready(name)
        # JupyterLab's news question is answered "never" for them (news_url=None alone does not stop it).
        # (The composite setting: the learner's own over the schema's default, which overrides.json sets.)
        r = hub.api(name, "GET", f"/user/{name}/lab/api/settings/@jupyterlab/apputils-extension:notification")
        assert r.status_code == 200, (r.status_code, r.text[:300])
        setting = r.json()
        default = setting["schema"]["properties"]["fetchNews"]["default"]
        assert (setting["settings"] or {}).get("fetchNews", default) == "false", setting["schema"]["properties"]
        # A session on the learner's own copy of chapter 01: its kernel runs in their notebooks/.
        kernels[name] = kernel = hub.session(name, "notebooks/01_naive_attention.ipynb")
        out, error = hub.run(name, kernel, "".join(first["source"]))
        assert error is None, f"chapter 01's first cell failed for {name}: {error}"
        out, error = hub.run(name, kernel, "".join(second["source"]))
        assert error is None and out == stored, (out, stored, error)  # the committed output, exactly
        out, error = hub.run(name, kernel, "import os; print(os.getuid(), os.getcwd(), course_lib.__file__)")
        uid, cwd, lib = out.split()
        assert int(uid) == pwd.getpwnam(name).pw_uid  # the kernel runs as the learner, not root
        assert cwd == f"{pwd.getpwnam(name).pw_dir}/flash-course/notebooks"
        assert lib == str(hub.root / "course" / "course_lib" / "__init__.py")

        # The learner saves their answers into their own copy of the exercise set.
        r = hub.api(name, "GET", f"/user/{name}/api/contents/exercises/{SET}.ipynb")
        assert r.status_code == 200, (r.status_code, r.text)
        nb = r.json()["content"]
        solved = {cid: src for ex in SOLVES[who[name]] for cid, src in answers[ex]}
        for cell in nb["cells"]:
            if cell["id"] in solved:
                cell["source"] = solved.pop(cell["id"])
        assert not solved
        r = hub.api(name, "PUT", f"/user/{name}/api/contents/exercises/{SET}.ipynb",
                    json={"type": "notebook", "format": "json", "content": nb})
        assert r.status_code == 200, (r.status_code, r.text)

    # The whole of chapter 01, in the learner's own copy, gives the committed outputs cell for cell
    # (nbval, as `make test` runs it): the same notebook runs on the hub as with `make lab`.
    sanitize = hub.root / "course" / "tests" / "sanitize.cfg"
    out, error = hub.run(bob, kernels[bob], "import subprocess, sys\n"
                         "r = subprocess.run([sys.executable, '-m', 'pytest', '-q', '--color=no', '-p', 'no:cacheprovider',"
                         f" '--nbval', '--nbval-current-env', '--nbval-sanitize-with', {str(sanitize)!r},"
                         " '01_naive_attention.ipynb'],"
                         " capture_output=True, text=True, timeout=600)\n"
                         "print('rc', r.returncode)\nprint(r.stdout[-3000:])", timeout=620)
    cells = sum(c["cell_type"] == "code" for c in chapter01["cells"])  # nbval: one test per code cell
    assert error is None and out.startswith("rc 0\n") and re.search(rf"^{cells} passed in ", out, re.M), out

    # A learner grades their own work from their kernel, as chapter 00 says (the sandbox runs as them).
    out, error = hub.run(bob, kernels[bob], "import subprocess, sys\n"
                         f"print(subprocess.run([sys.executable, '-m', 'course_lib.grade', '../exercises/{SET}.ipynb'],"
                         " capture_output=True, text=True, timeout=300).stdout)", timeout=320)
    assert error is None and f"graded 1 submission: 2 / {sum(points.values())} points in all" in out, (out, error)

    # Each password opens its own account only (a shared class password would open every one).
    assert hub.refused(ada, hub.passwords[bob]) and hub.refused(bob, hub.passwords[ada])
    assert hub.refused(ada, hub.passwords[ada] + "x")

    # Neither can reach the other's files or the instructor's; each can reach its own (the probe works).
    for me, other in ((ada, bob), (bob, ada)):
        mine, theirs = (Path(pwd.getpwnam(n).pw_dir) for n in (me, other))
        got = _probe(hub, me, kernels[me], {
            "own notebook (read)": [f"{mine}/flash-course/exercises/{SET}.ipynb", "read"],
            "own notebook (write)": [f"{mine}/flash-course/exercises/{SET}.ipynb", "write"],
            "other's home (list)": [str(theirs), "list"],
            "other's notebook (read)": [f"{theirs}/flash-course/exercises/{SET}.ipynb", "read"],
            "other's notebook (write)": [f"{theirs}/flash-course/exercises/{SET}.ipynb", "write"],
            "hub state (list)": [str(hub.root / "state"), "list"],
            "passwords (read)": [str(hub.root / "state" / "passwords.csv"), "read"],
            "hub database (write)": [str(hub.root / "state" / "jupyterhub.sqlite"), "write"],
            "installed course (write)": [str(hub.root / "course" / "exercises" / f"{SET}.ipynb"), "write"],
            "course_lib (write)": [str(hub.root / "course" / "course_lib" / "checks.py"), "write"],
            "learners' venv (write)": [str(hub.root / "venv" / "pyvenv.cfg"), "write"],
            "instructor's checkout (write)": [str(REPO / "exercises" / f"{SET}.ipynb"), "write"],
        })
        assert got == {k: ("allowed" if k.startswith("own") else "denied") for k in got}, (me, got)
        # Nor through the hub: their own token opens only their own server.
        assert hub.api(me, "GET", f"/user/{me}/api/contents/exercises").status_code == 200
        r = hub.api(other, "GET", f"/user/{other}/api/contents/exercises/{SET}.ipynb", as_=me)
        assert r.status_code in (403, 404), (me, other, r.status_code)
        assert hub.api(me, "GET", f"/hub/api/users/{other}", as_=me).status_code in (403, 404)

    # A course update: new files reach the learner at their next start; their work is kept.
    (hub.root / "course" / "notebooks" / "99_update.ipynb").write_text((REPO / "notebooks" / "00_start_here.ipynb").read_text())
    pristine = (REPO / "exercises" / f"{SET}.ipynb").read_text()
    (hub.root / "course" / "exercises" / f"{SET}.ipynb").write_text(pristine.replace("YOUR CODE HERE", "UPDATED"))
    assert hub.api(ada, "DELETE", f"/hub/api/users/{ada}/server").status_code in (202, 204)
    hub.wait_ready(ada)
    r = hub.api(ada, "GET", f"/user/{ada}/api/contents/notebooks/99_update.ipynb")
    assert r.status_code == 200
    mine = hub.api(ada, "GET", f"/user/{ada}/api/contents/exercises/{SET}.ipynb").json()["content"]
    assert "UPDATED" not in json.dumps(mine)
    assert answers["1.1"][0][1] in ["".join(c["source"]) for c in mine["cells"]]
    kernels[ada] = hub.session(ada, "notebooks/01_naive_attention.ipynb")  # the restart ended her kernel

    # Collect and grade: one command, one CSV, each learner's points.
    out = _workshop(hub.root, "grade", SET, "--jobs", "2", "--timeout", "120", "--processes", "256",
                    "--deadline", "2020-01-01T00:00+00:00")  # long past: both notebooks changed after it
    with open(hub.root / "state" / "grades" / f"{SET}.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == coursework.GRADE_COLUMNS
    for name in hub.names:
        mine = {r["exercise"]: r for r in rows if r["learner"] == name}
        assert sorted(mine) == sorted(points), (name, sorted(mine))
        for ex, row in mine.items():
            expect = "pass" if ex in SOLVES[who[name]] else "fail"
            assert (row["status"], int(row["points"])) == (expect, points[ex] if expect == "pass" else 0), (name, row)
            assert expect == "pass" or row["reason"], row  # a non-pass says why
    assert {r["learner"] for r in rows} == set(hub.names)  # the instructor is not graded with the class
    total = {n: sum(points[ex] for ex in SOLVES[who[n]]) for n in hub.names}
    out_of = sum(points.values())
    assert total == {ada: out_of, bob: 2}  # so the two rows above really differ
    assert f"{ada}: {out_of} / {out_of}" in out and f"{bob}: 2 / {out_of}" in out, out
    # Each submission's times, hash and lateness, beside the collected notebooks.
    collected = hub.root / "state" / "collected" / SET
    with open(collected / "submissions.csv", newline="") as f:
        submitted = {r["learner"]: r for r in csv.DictReader(f)}
    assert sorted(submitted) == hub.names
    for name, row in submitted.items():
        assert row["status"] == "collected" and row["late"] == "yes" and row["deadline"] == "2020-01-01T00:00:00Z"
        assert row["sha256"] == hashlib.sha256((collected / f"{name}.ipynb").read_bytes()).hexdigest()
        assert row["changed_at"] >= row["saved_at"] > "2026", row
    # A hand mark of ada's written defence, as the instructor types it into the sheet.
    (hub.root / "state" / "manual.csv").write_text("learner,exercise_set,exercise,points,max_points,comment\n"
                                                   f"{ada},{SET},1.8 defence,1,2,the mask argument is missing\n")

    # Hostile folders: bob points his feedback file at the hub's passwords and his set 02 at ada's;
    # ada's set 03 is a FIFO (a reader that follows it as root would block or read another's file).
    passwords = hub.root / "state" / "passwords.csv"
    before = passwords.read_bytes()
    ada_home, bob_home = (pwd.getpwnam(n).pw_dir for n in (ada, bob))
    out, error = hub.run(bob, kernels[bob], f"""import os
os.symlink({str(passwords)!r}, {bob_home + f'/flash-course/feedback/{SET}.txt'!r})
os.remove('../exercises/02_roofline.ipynb')
os.symlink({ada_home + '/flash-course/exercises/02_roofline.ipynb'!r}, '../exercises/02_roofline.ipynb')""")
    assert error is None, error
    out, error = hub.run(ada, kernels[ada], "import os\nos.remove('../exercises/03_tiling_and_sram.ipynb')\n"
                                             "os.mkfifo('../exercises/03_tiling_and_sram.ipynb')")
    assert error is None, error
    out = _workshop(hub.root, "collect", "02_roofline", timeout=120)
    assert re.search(rf"^{bob}: nothing collected \(.*Permission denied", out, re.M), out
    assert (hub.root / "state" / "collected" / "02_roofline" / f"{ada}.ipynb").exists()
    assert not (hub.root / "state" / "collected" / "02_roofline" / f"{bob}.ipynb").exists()
    out = _workshop(hub.root, "collect", "03_tiling_and_sram", timeout=120)
    assert re.search(rf"^{ada}: nothing collected \(not a regular file\)", out, re.M), out

    # Feedback: a file in each learner's folder, theirs alone, with their own score.
    _workshop(hub.root, "feedback", SET)
    assert passwords.read_bytes() == before  # bob's symlink was replaced, not followed
    for name in hub.names:
        path = Path(pwd.getpwnam(name).pw_dir) / "flash-course" / "feedback" / f"{SET}.txt"
        st = path.stat()
        assert st.st_uid == pwd.getpwnam(name).pw_uid and stat.S_IMODE(st.st_mode) == 0o600
        r = hub.api(name, "GET", f"/user/{name}/api/contents/feedback/{SET}.txt")
        assert r.status_code == 200
        text = r.json()["content"]
        got, of = (total[name] + 1, out_of + 2) if name == ada else (total[name], out_of)
        assert text.startswith(f"Feedback on exercise set {SET}: {got} / {of} points"), text
        assert "LATE" in text and (("the mask argument is missing" in text) == (name == ada)), text
    # One gradebook: the set's points, its late flag, the hand marks, the total.
    _workshop(hub.root, "gradebook")
    with open(hub.root / "state" / "gradebook.csv", newline="") as f:
        book = {r["learner"]: r for r in csv.DictReader(f)}
    assert sorted(book) == hub.names
    assert book[ada][f"{SET} (/{out_of})"] == str(out_of) and book[bob][f"{SET} (/{out_of})"] == "2"
    assert (book[ada]["total"], book[ada]["max_points"]) == (str(out_of + 1), str(out_of + 2))
    assert (book[bob]["total"], book[bob]["max_points"]) == ("2", str(out_of))
    assert book[ada][f"{SET} late"] == book[bob][f"{SET} late"] == "yes"


def test_the_instructor_logs_in_to_the_admin_page_and_is_no_learner(hub):
    # An account outside the learners' group: the hub lets it in (not "User not allowed") as an admin.
    s = hub.login(hub.teacher)
    assert s.get(f"{hub.url}/hub/admin", timeout=60).status_code == 200
    hub.wait_ready(hub.teacher)  # the login spawned their server (a JupyterLab of their own, as a learner's)
    r = hub.api(hub.teacher, "GET", "/hub/api/users")
    assert r.status_code == 200 and set(hub.names) <= {u["name"] for u in r.json()}, (r.status_code, r.text[:300])
    assert {u["name"]: u["admin"] for u in r.json()}[hub.teacher]
    # ... and a learner is not an admin, and cannot be made one (they would be graded as a learner).
    assert hub.api(hub.names[0], "GET", "/hub/api/users").status_code == 403
    done = subprocess.run([sys.executable, str(REPO / "classroom" / "workshop.py"), "--root", str(hub.root),
                           "add-instructor", hub.names[0]], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and f"{hub.names[0]} is a learner" in done.stderr, done.stderr
    # `add-learners` refuses the instructor's name, saying what it is.
    done = subprocess.run([sys.executable, str(REPO / "classroom" / "workshop.py"), "--root", str(hub.root),
                           "add-learners", hub.teacher], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "is an instructor" in done.stderr, done.stderr


def test_a_hub_restart_keeps_every_server_kernel_and_open_tab(hub):
    bob = hub.names[1]
    place = machine.Place(hub.root)
    proxy = service.proxy_pid(place)
    hub.wait_ready(bob)
    kernel = hub.session(bob, "notebooks/01_naive_attention.ipynb")
    out, error = hub.run(bob, kernel, "unsaved = 6 * 7")
    assert error is None, error
    server = {p for p in machine.pids_of_uid(pwd.getpwnam(bob).pw_uid) if "jupyterhub-singleuser" in " ".join(machine.cmdline(p))}
    log_before = (hub.root / "state" / "hub.log").stat().st_size
    out = _workshop(hub.root, "restart")
    assert "learners' servers kept running" in out, out
    # The same proxy, the same server process, the same kernel with its state: nothing to relaunch.
    assert service.proxy_pid(place) == proxy
    assert server and server <= set(machine.pids_of_uid(pwd.getpwnam(bob).pw_uid))
    out, error = hub.run(bob, kernel, "print(unsaved)")
    assert error is None and out == "42\n", (out, error)
    r = hub.api(bob, "GET", f"/hub/api/users/{bob}")
    assert r.json()["servers"][""]["ready"], r.json()
    # The hub's own log has no error (the learners' servers log there too: theirs said, while the hub
    # was away, that they could not reach it, which is what a restart looks like from a server).
    log = (hub.root / "state" / "hub.log").read_bytes()[log_before:].decode(errors="replace")
    assert not HUB_ERROR.findall(log), log[-3000:]


def test_stop_ends_the_hub_the_proxy_and_every_learners_process(hub):
    for name in hub.names:
        hub.wait_ready(name)  # running already, after the tests above
    place = machine.Place(hub.root)
    hub_pid = service.hub_pid(place)
    proxy_pid = int((hub.root / "state" / "proxy.pid").read_text())
    uids = [pwd.getpwnam(n).pw_uid for n in hub.names]
    assert hub_pid and _alive(hub_pid) and _alive(proxy_pid)
    assert all(machine.pids_of_uid(u) for u in uids)  # both learners have a server running now
    out = _workshop(hub.root, "stop")
    assert "still running" not in out, out  # the hub itself ended them; stop's fallback was not needed
    time.sleep(1)
    assert not _alive(hub_pid) and not _alive(proxy_pid)
    left = {u: machine.pids_of_uid(u) for u in uids}
    assert not any(left.values()), left
    strays = [p.name for p in Path("/proc").iterdir() if p.name.isdigit()
              and str(hub.root) in " ".join(machine.cmdline(int(p.name)))]
    assert not strays, [machine.cmdline(int(p)) for p in strays]


def test_a_bare_start_keeps_its_options_and_refuses_readable_solutions(hub):
    # A copy of the solutions that learners could read (a world-readable clone left on the machine).
    clone = hub.root / "left-behind-clone"
    (clone / "course_lib").mkdir(parents=True)
    (clone / "solutions").mkdir()
    shutil.copyfile(REPO / "solutions" / f"{SET}.ipynb", clone / "solutions" / f"{SET}.ipynb")
    for path in (clone, clone / "course_lib", clone / "solutions"):
        path.chmod(0o755)
    (clone / "solutions" / f"{SET}.ipynb").chmod(0o644)
    done = subprocess.run([sys.executable, str(REPO / "classroom" / "workshop.py"), "--root", str(hub.root), "start"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and f"{clone / 'solutions'}: the solutions" in done.stderr, (done.stdout, done.stderr)
    assert service.hub_pid(machine.Place(hub.root)) is None
    shutil.rmtree(clone)
    # No options but the override: the last start's address, ports and instructors are used again.
    out = _workshop(hub.root, "start", "--accept-readable-solutions")
    assert f"the hub is up at {hub.url} " in out and f"instructors: {hub.teacher}" in out, out
    hub.login(hub.teacher)


def test_removed_learners_leave_no_user_in_the_hub_and_no_group(hub):
    ada, bob = hub.names
    place = machine.Place(hub.root)
    assert service.hub_pid(place), "the test before started the hub"
    _workshop(hub.root, "remove-learners", bob)  # the hub runs: through its API
    r = hub.api(hub.teacher, "GET", "/hub/api/users")
    assert r.status_code == 200 and bob not in {u["name"] for u in r.json()} and ada in {u["name"] for u in r.json()}
    _workshop(hub.root, "stop")
    out = _workshop(hub.root, "remove-learners", ada)  # the hub is stopped: from its database
    assert f"group {hub.group} removed" in out, out
    with pytest.raises(KeyError):
        grp.getgrnam(hub.group)
    log_before = (hub.root / "state" / "hub.log").stat().st_size
    _workshop(hub.root, "start", "--accept-readable-solutions")
    log = (hub.root / "state" / "hub.log").read_bytes()[log_before:].decode(errors="replace")
    assert "Error adding user" not in log and not HUB_ERROR.findall(log), log[-3000:]
    hub.tokens.clear()  # the teacher's token survives, but ask afresh: the users are read from the database
    names = {u["name"] for u in hub.api(hub.teacher, "GET", "/hub/api/users").json()}
    assert names == {hub.teacher}, names
    _workshop(hub.root, "stop")
