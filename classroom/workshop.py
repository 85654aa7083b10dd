"""Run a workshop of the course on one machine: JupyterHub, one system account per learner.

    sudo python3 classroom/workshop.py install                 # the learners' course, its venv, the proxy
    sudo python3 classroom/workshop.py add-learners ada grace  # accounts; prints each one's password
    sudo python3 classroom/workshop.py start                   # the hub on http://<this machine>:8000
    sudo python3 classroom/workshop.py status
    sudo python3 classroom/workshop.py grade 01_naive_attention     # collect + sandboxed grader -> one CSV
    sudo python3 classroom/workshop.py feedback 01_naive_attention  # ~/flash-course/feedback/ of each learner
    sudo python3 classroom/workshop.py stop

Everything lives under one folder (``--root``, default /opt/flash-course-hub):

    course/   what learners may read: lectures, exercises, course_lib (no solutions/, no tests/)
    venv/     the learners' Python: the course's pins, course_lib, JupyterLab, jupyterhub-singleuser
    proxy/    configurable-http-proxy from npm
    state/    root's alone (0700): settings, hub database and cookie secret, log, passwords,
              collected notebooks, grades

It must run as root: the hub starts each learner's server as that learner, and only root can.
Only the standard library is used here; grading calls the checkout's ``.venv`` (``make venv``).
Every file a learner controls is read or written *as that learner* (a child process with their
uid), so a symlink or a FIFO in their folder reaches nothing they could not reach themselves.
"""
from __future__ import annotations

import argparse
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
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_ROOT = Path("/opt/flash-course-hub")
DEFAULT_GROUP = "flash-learners"
# What learners get, copied from the checkout; solutions/, tests/ and .git stay with the instructor.
COURSE_PARTS = ("pyproject.toml", "README.md", "course_lib", "notebooks", "exercises",
                "tests/sanitize.cfg", "classroom/learner_start.py", "classroom/jupyterhub_config.py")
IGNORE = shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints", "*.egg-info", "*.pyc")
# configurable-http-proxy 5.2 and later need Node >= 20; Debian 12's nodejs is 18, which 5.1 supports.
PROXY_PACKAGES = {20: "configurable-http-proxy@5.3.0", 18: "configurable-http-proxy@5.1.0"}
NAME = re.compile(r"^[a-z][a-z0-9_-]{0,30}$")
MAX_NOTEBOOK_BYTES = 32 * 2**20
HUB_START_S = 120
HUB_STOP_S = 90


class Failed(Exception):
    """A step failed; the message says what to do."""


# -- places -----------------------------------------------------------------------------------

class Place:
    def __init__(self, root: Path):
        self.root = Path(root).resolve()
        self.course, self.venv, self.proxy = self.root / "course", self.root / "venv", self.root / "proxy"
        self.state = self.root / "state"

    @property
    def settings_file(self):
        return self.state / "settings.json"

    def settings(self) -> dict:
        try:
            return json.loads(self.settings_file.read_text())
        except FileNotFoundError:
            raise Failed(f"nothing installed at {self.root}: run `workshop.py install` first") from None

    def save_settings(self, settings: dict) -> None:
        tmp = self.settings_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(settings, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, self.settings_file)

    def proxy_command(self) -> Path:
        return self.proxy / "node_modules" / ".bin" / "configurable-http-proxy"


def _run(argv, **kwargs):
    """Run a command; on failure raise Failed with the end of its output."""
    done = subprocess.run([str(a) for a in argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, **kwargs)
    if done.returncode:
        raise Failed(f"{' '.join(map(str, argv))} exited with {done.returncode}:\n{done.stdout[-3000:]}")
    return done.stdout


def _need_root():
    if os.geteuid() != 0:
        raise Failed("run this as root (sudo): the hub starts each learner's server as that learner, "
                     "and accounts are made with useradd")


# -- install -----------------------------------------------------------------------------------

def _tree_digest(path: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(path)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def _readable_by_others(path: Path) -> bool:
    """Whether an unprivileged account could read ``path`` (every parent searchable, it readable)."""
    path = path.resolve()
    for parent in reversed(path.parents):
        if not parent.stat().st_mode & 0o001:
            return False
    return bool(path.stat().st_mode & 0o004)


def runs_as_nobody(argv) -> str | None:
    """None if ``argv`` runs for an unprivileged account (uid 65534), else what went wrong."""
    try:
        done = subprocess.run([str(a) for a in argv], user=65534, group=65534, extra_groups=[], cwd="/",
                              env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}, capture_output=True,
                              text=True, timeout=300)
    except OSError as exc:
        return str(exc)
    return None if done.returncode == 0 else (done.stderr.strip().splitlines() or ["exit %d" % done.returncode])[-1]


def default_python() -> str:
    """The distribution's Python if there is one (learners can run it), else this one."""
    return "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def install(place: Place, group: str, python: str) -> None:
    """Copy the course for learners, build its venv (only when the pins changed) and the proxy."""
    _need_root()
    why = runs_as_nobody([python, "-c", "import venv, ensurepip"])
    if why:
        raise Failed(f"learners could not use {python} for their venv ({why}). A venv links to its base "
                     f"Python, so that Python must be readable by every account (one under /root, such as "
                     f"pyenv's, is not) and have venv: pass --python /usr/bin/python3 (Debian / Ubuntu: "
                     f"apt-get install python3-venv)")
    if not shutil.which("npm") or not shutil.which("node"):
        raise Failed("npm is not installed: the hub's proxy (configurable-http-proxy) comes from npm. "
                     "Debian / Ubuntu: apt-get install nodejs npm")
    for folder in (place.root, place.root / "state"):
        folder.mkdir(parents=True, exist_ok=True)
    os.chmod(place.root, 0o755)
    os.chmod(place.state, 0o700)

    # 1. The course learners read: a fresh copy, world-readable, root-owned, swapped in whole.
    old_digest = _tree_digest(place.course) if place.course.exists() else None
    new = place.root / "course.new"
    shutil.rmtree(new, ignore_errors=True)
    for part in COURSE_PARTS:
        src, dst = REPO / part, new / part
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=IGNORE)
        else:
            shutil.copyfile(src, dst)
    for top, dirs, files in os.walk(new):
        os.chmod(top, 0o755)
        for f in files:
            os.chmod(os.path.join(top, f), 0o644)
    if place.course.exists():
        gone = place.root / "course.old"
        shutil.rmtree(gone, ignore_errors=True)
        os.replace(place.course, gone)
        os.replace(new, place.course)
        shutil.rmtree(gone)
    else:
        os.replace(new, place.course)
    changed = old_digest is not None and old_digest != _tree_digest(place.course)
    print(f"course copied to {place.course}" + (" (updated: learners get the new files at their next "
                                               "server start; files they have are kept)" if changed else ""))

    # 2. The learners' Python: built again only when pyproject.toml (the pins) changed.
    version = _run([python, "-c", "import sys; print(sys.version)"])
    stamp = hashlib.sha256((REPO / "pyproject.toml").read_bytes() + version.encode()).hexdigest()
    stamp_file = place.venv / ".installed"
    if not stamp_file.exists() or stamp_file.read_text() != stamp:
        print(f"building the learners' virtual environment in {place.venv} (a few minutes the first time)")
        if not (place.venv / "bin" / "python").exists():
            _run([python, "-m", "venv", place.venv])
        py = place.venv / "bin" / "python"
        _run([py, "-m", "pip", "install", "-q", "--upgrade", "pip"])
        # Editable, pointing at course/ (which is swapped in place above): a course update needs no
        # reinstall, and learners import exactly the course_lib they can read.
        _run([py, "-m", "pip", "install", "-q", "-e", f"{place.course}[hub]"])
        _run([py, "-m", "ipykernel", "install", "--sys-prefix", "--name", "python3",
              "--display-name", "Python 3 (FlashAttention course)"])
        stamp_file.write_text(stamp)
    _run(["chmod", "-R", "go+rX,go-w", place.venv])  # readable by learners, writable by root only
    why = runs_as_nobody([place.venv / "bin" / "python", "-c", "import course_lib, jupyterhub, jupyterlab"])
    if why:
        raise Failed(f"an unprivileged account cannot use {place.venv}: {why}")

    # 3. The proxy.
    if not place.proxy_command().exists():
        node = int(_run(["node", "-p", "process.versions.node.split('.')[0]"]).strip())
        package = next((p for major, p in sorted(PROXY_PACKAGES.items(), reverse=True) if node >= major), None)
        if package is None:
            raise Failed(f"Node {node} is too old for the hub's proxy (configurable-http-proxy needs >= 18)")
        print(f"installing {package} from npm into {place.proxy}")
        place.proxy.mkdir(exist_ok=True)
        _run(["npm", "install", "--prefix", place.proxy, "--no-audit", "--no-fund", "--loglevel=error", package])

    settings = json.loads(place.settings_file.read_text()) if place.settings_file.exists() else {}
    settings.update(root=str(place.root), group=group or settings.get("group", DEFAULT_GROUP))
    place.save_settings(settings)
    if (REPO / "solutions").exists() and _readable_by_others(REPO / "solutions"):
        print(f"warning: {REPO / 'solutions'} can be read by every account on this machine, learners "
              f"included. Keep the checkout where they cannot (for example under /root), or: "
              f"chmod 700 {REPO / 'solutions'} {REPO / '.git'}")
    print("installed. Next: workshop.py add-learners NAME..., then workshop.py start")


# -- learners ----------------------------------------------------------------------------------

def learners(group: str) -> list:
    """The learners: the members of ``group``, sorted."""
    try:
        return sorted(grp.getgrnam(group).gr_mem)
    except KeyError:
        return []


def add_learners(place: Place, names: list) -> dict:
    """Make a system account for each name (home 0700, in the learners' group); return their passwords."""
    _need_root()
    group = place.settings()["group"]
    bad = [n for n in names if not NAME.match(n)]
    if bad:
        raise Failed(f"not a usable account name: {', '.join(bad)} (lower-case letters, digits, - and _, "
                     "starting with a letter, at most 31 characters)")
    try:
        grp.getgrnam(group)
    except KeyError:
        _run(["groupadd", group])
    passwords = {}
    for name in names:
        try:
            pwd.getpwnam(name)
        except KeyError:
            pass
        else:
            if name in learners(group):
                print(f"{name}: already a learner (password unchanged)")
                continue
            raise Failed(f"{name} is an existing account on this machine and not a learner: pick another name "
                         "(the hub would hand that account's files to whoever gets the password)")
        _run(["useradd", "--create-home", "--shell", "/bin/bash", "--groups", group,
              "--key", "HOME_MODE=0700", "--comment", "flash-course learner", name])
        os.chmod(pwd.getpwnam(name).pw_dir, 0o700)
        password = secrets.token_urlsafe(9)
        _run(["chpasswd"], input=f"{name}:{password}\n")
        passwords[name] = password
    if passwords:
        sheet = place.state / "passwords.csv"
        fd = os.open(sheet, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a", newline="") as f:
            csv.writer(f, lineterminator="\n").writerows(passwords.items())
        for name, password in passwords.items():
            print(f"{name}\t{password}")
        print(f"(also appended to {sheet}, readable by root only)")
    return passwords


def remove_learners(place: Place, names: list) -> None:
    """Delete learners' accounts *and their homes* (their work): collect first."""
    _need_root()
    group = place.settings()["group"]
    strangers = [n for n in names if n not in learners(group)]
    if strangers:
        raise Failed(f"not learners of group {group}: {', '.join(strangers)}; nothing removed")
    for name in names:
        uid = pwd.getpwnam(name).pw_uid
        for pid in _pids_of_uid(uid):
            _kill(pid, signal.SIGKILL)
        _run(["userdel", "--remove", name])
        print(f"{name}: account and home removed")


# -- the hub -----------------------------------------------------------------------------------

def _cmdline(pid: int) -> list:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _pids_of_uid(uid: int) -> list:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def _kill(pid: int, sig) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def hub_pid(place: Place) -> int | None:
    """The running hub's pid, if the pid file names a live jupyterhub with our config."""
    try:
        pid = int((place.state / "hub.pid").read_text())
    except (OSError, ValueError):
        return None
    cmd = _cmdline(pid)
    if any(a.endswith("jupyterhub") for a in cmd) and str(place.course / "classroom" / "jupyterhub_config.py") in cmd:
        return pid
    return None


def _url(settings) -> str:
    host = "127.0.0.1" if settings["ip"] in ("", "0.0.0.0") else settings["ip"]
    return f"http://{host}:{settings['port']}"


def _log_tail(place: Place, lines=30) -> str:
    try:
        return "\n".join((place.state / "hub.log").read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def start(place: Place, ip: str, port: int, hub_port: int, proxy_api_port: int, admins: list) -> str:
    """Start the hub in the background; return its URL once it answers."""
    _need_root()
    if hub_pid(place):
        raise Failed(f"the hub is already running (pid {hub_pid(place)}); `workshop.py stop` first")
    if not place.proxy_command().exists() or not (place.venv / "bin" / "jupyterhub").exists():
        raise Failed(f"nothing installed at {place.root}: run `workshop.py install` first")
    settings = place.settings()
    settings.update(ip=ip, port=port, hub_port=hub_port, proxy_api_port=proxy_api_port, admins=admins)
    place.save_settings(settings)
    env = {"PATH": f"{place.venv / 'bin'}:/usr/local/bin:/usr/bin:/bin", "CLASSROOM_STATE": str(place.state),
           "LANG": os.environ.get("LANG", "C.UTF-8")}
    with open(place.state / "hub.log", "ab") as log:
        hub = subprocess.Popen([place.venv / "bin" / "jupyterhub", "-f",
                                place.course / "classroom" / "jupyterhub_config.py"],
                               cwd=place.state, env=env, stdin=subprocess.DEVNULL, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    (place.state / "hub.pid").write_text(f"{hub.pid}\n")
    url = _url(settings)
    deadline = time.monotonic() + HUB_START_S
    while True:
        if hub.poll() is not None:
            raise Failed(f"the hub exited with {hub.returncode}; its log ({place.state / 'hub.log'}) ends:\n"
                         + _log_tail(place))
        try:
            with urllib.request.urlopen(f"{url}/hub/health", timeout=5) as reply:
                if reply.status == 200:
                    break
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise Failed(f"the hub did not answer within {HUB_START_S} s; its log ends:\n" + _log_tail(place))
        time.sleep(0.5)
    print(f"the hub is up at {url} (pid {hub.pid}; log {place.state / 'hub.log'}); "
          f"learners of group {settings['group']} log in with their passwords")
    return url


def stop(place: Place) -> None:
    """Stop the hub; it stops the learners' servers and the proxy. Stragglers are killed and named."""
    _need_root()
    pid = hub_pid(place)
    if pid is None:
        print("the hub is not running")
    else:
        _kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + HUB_STOP_S
        while _cmdline(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _cmdline(pid):
            print(f"the hub (pid {pid}) did not stop within {HUB_STOP_S} s: killing it")
            _kill(pid, signal.SIGKILL)
        (place.state / "hub.pid").unlink(missing_ok=True)
        print("the hub stopped")
    # What the hub should have ended: the proxy, and every process of every learner.
    left = []
    try:
        proxy = int((place.state / "proxy.pid").read_text())
        if any("configurable-http-proxy" in a for a in _cmdline(proxy)):
            left.append(proxy)
    except (OSError, ValueError):
        pass
    group = place.settings().get("group", DEFAULT_GROUP)
    for name in learners(group):
        left += _pids_of_uid(pwd.getpwnam(name).pw_uid)
    for p in left:
        print(f"still running after the hub stopped, killed: pid {p} {' '.join(_cmdline(p))[:120]}")
        _kill(p, signal.SIGKILL)


def status(place: Place) -> None:
    settings = place.settings()
    pid = hub_pid(place)
    print(f"hub: {'running at ' + _url(settings) + f' (pid {pid})' if pid else 'not running'}")
    for name in learners(settings["group"]):
        n = len(_pids_of_uid(pwd.getpwnam(name).pw_uid))
        print(f"  {name}: {f'{n} process(es)' if n else 'no server'}")


# -- submissions, grades, feedback --------------------------------------------------------------

# Run as the learner: read one of their files, refusing anything but a regular file of bounded size.
_READER = r"""
import os, stat, sys
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_NONBLOCK)
if not stat.S_ISREG(os.fstat(fd).st_mode):
    sys.exit("not a regular file")
data = os.read(fd, int(sys.argv[2]) + 1)
if len(data) > int(sys.argv[2]):
    sys.exit("larger than %s bytes" % sys.argv[2])
sys.stdout.buffer.write(data)
"""
# Run as the learner: write stdin to a file of theirs (a temporary file, then renamed over it).
_WRITER = r"""
import os, sys
path = sys.argv[1]
os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
tmp = path + ".tmp-%d" % os.getpid()
fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
with os.fdopen(fd, "wb") as f:
    f.write(sys.stdin.buffer.read())
os.replace(tmp, path)
"""


def as_learner(place: Place, name: str, code: str, args: list, data: bytes | None = None, timeout=60):
    """Run ``code`` with the learner's uid, gid and groups, a bare environment, in /; (rc, out, err).

    The interpreter is the learners' venv's (one they can run), with -I -S: nothing of theirs is imported.
    """
    user = pwd.getpwnam(name)
    done = subprocess.run([str(place.venv / "bin" / "python"), "-I", "-S", "-c", code, *map(str, args)],
                          user=user.pw_uid, group=user.pw_gid, extra_groups=os.getgrouplist(name, user.pw_gid),
                          env={"PATH": "/usr/bin:/bin", "HOME": user.pw_dir}, cwd="/", umask=0o077,
                          input=data or b"", capture_output=True, timeout=timeout)
    return done.returncode, done.stdout, done.stderr.decode(errors="replace").strip()[-300:]


def _set_name(exercise_set: str) -> str:
    if not re.fullmatch(r"\d\d_[a-z0-9_]+", exercise_set) or not (REPO / "exercises" / f"{exercise_set}.ipynb").exists():
        known = ", ".join(p.stem for p in sorted((REPO / "exercises").glob("*.ipynb")))
        raise Failed(f"no exercise set {exercise_set!r}; the sets are: {known}")
    return exercise_set


def collect(place: Place, exercise_set: str) -> dict:
    """Copy each learner's ~/flash-course/exercises/SET.ipynb, read as that learner, to state/collected/SET/.

    Returns {learner: path collected, or None with the reason printed}.
    """
    _need_root()
    exercise_set = _set_name(exercise_set)
    out = place.state / "collected" / exercise_set
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True, mode=0o700)
    found = {}
    for name in learners(place.settings()["group"]):
        path = Path(pwd.getpwnam(name).pw_dir) / "flash-course" / "exercises" / f"{exercise_set}.ipynb"
        try:
            rc, data, err = as_learner(place, name, _READER, [path, MAX_NOTEBOOK_BYTES])
        except subprocess.TimeoutExpired:
            rc, data, err = 1, b"", "reading it took too long"
        if rc:
            found[name] = None
            print(f"{name}: nothing collected ({err.splitlines()[-1] if err else 'unreadable'})")
            continue
        target = out / f"{name}.ipynb"
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        found[name] = target
    print(f"collected {sum(1 for p in found.values() if p)} of {len(found)} learners' {exercise_set} "
          f"into {out}")
    return found


GRADE_COLUMNS = ["learner", "submission", "exercise_set", "exercise", "status", "points", "max_points", "reason"]


def grade(place: Place, exercise_set: str, jobs: int, timeout: float | None, processes: int | None = None) -> Path:
    """Collect, then grade with the sandboxed grader into state/grades/SET.csv (one row per learner and exercise)."""
    found = collect(place, exercise_set)
    python = REPO / ".venv" / "bin" / "python"
    if not python.exists():
        raise Failed(f"{python} is missing: run `make venv` in {REPO} first (the grader runs from it)")
    grades = place.state / "grades"
    grades.mkdir(mode=0o700, exist_ok=True)
    raw = grades / f"{exercise_set}.grader.csv"
    paths = [p for p in found.values() if p]
    rows = []
    if paths:
        argv = [python, "-m", "course_lib.grade", *paths, "--set", exercise_set, "--csv", raw, "--jobs", jobs]
        if timeout:
            argv += ["--timeout", timeout]
        if processes:
            argv += ["--processes", processes]
        done = subprocess.run([str(a) for a in argv], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
        (grades / f"{exercise_set}.grader.log").write_text(done.stdout)
        if done.returncode:
            raise Failed(f"the grader exited with {done.returncode}:\n{done.stdout[-3000:]}")
        with open(raw, newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                row["learner"] = Path(row["submission"]).stem
                rows.append(row)
    exercises = _exercises(exercise_set)
    for name, path in found.items():
        if path is None:
            rows += [dict(learner=name, submission="", exercise_set=exercise_set, exercise=ex, status="missing",
                          points=0, max_points=pts, reason=f"no readable exercises/{exercise_set}.ipynb in the "
                                                           "learner's course folder when it was collected")
                     for ex, pts in exercises]
    rows.sort(key=lambda r: r["learner"])
    for row in rows:
        row["reason"] = spreadsheet_safe(row["reason"])
    out = grades / f"{exercise_set}.csv"
    with open(out, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, GRADE_COLUMNS, lineterminator="\n", extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    for name in found:
        got = sum(int(r["points"]) for r in rows if r["learner"] == name)
        of = sum(int(r["max_points"]) for r in rows if r["learner"] == name)
        print(f"{name}: {got} / {of}")
    print(f"grades of {exercise_set}: {out}")
    return out


def spreadsheet_safe(text: str) -> str:
    """A reason can quote a learner's own error message: one a spreadsheet would run as a formula gets a '."""
    return "'" + text if text.startswith(("=", "+", "-", "@", "\t", "\r")) else text


def _exercises(exercise_set: str) -> list:
    """[(exercise, points)] of a set, read from its pristine notebook's check cells."""
    nb = json.loads((REPO / "exercises" / f"{exercise_set}.ipynb").read_text())
    out = []
    for cell in nb["cells"]:
        course = cell.get("metadata", {}).get("course", {})
        if "check" in cell.get("metadata", {}).get("tags", []):
            out.append((course.get("exercise", "?"), int(course.get("points", 0))))
    return out


def feedback_text(exercise_set: str, rows: list, when: str) -> str:
    got = sum(int(r["points"]) for r in rows)
    of = sum(int(r["max_points"]) for r in rows)
    width = max([8] + [len(r["exercise"]) for r in rows])
    lines = [f"Feedback on exercise set {exercise_set}: {got} / {of} points",
             f"(graded {when} from exercises/{exercise_set}.ipynb as it was saved when collected)", "",
             f"{'exercise':<{width}}  {'status':<8}  {'points':>7}  reason"]
    for r in rows:
        lines.append(f"{r['exercise']:<{width}}  {r['status']:<8}  {r['points'] + ' / ' + r['max_points']:>7}  "
                     f"{r['reason']}".rstrip())
    lines += ["", "pass: the check's points. fail: the check said no (or the answer is still a stub). "
              "error / timeout: it raised or ran too long. tampered: a check cell was edited. "
              "Run the check cell under an exercise to see where an answer goes wrong."]
    return "\n".join(lines) + "\n"


def feedback(place: Place, exercise_set: str) -> dict:
    """Write each learner's rows of state/grades/SET.csv to ~/flash-course/feedback/SET.txt, as the learner."""
    _need_root()
    exercise_set = _set_name(exercise_set)
    sheet = place.state / "grades" / f"{exercise_set}.csv"
    if not sheet.exists():
        raise Failed(f"no grades for {exercise_set}: run `workshop.py grade {exercise_set}` first")
    with open(sheet, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    when = datetime.fromtimestamp(sheet.stat().st_mtime, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    written = {}
    for name in sorted({r["learner"] for r in rows}):
        if name not in learners(place.settings()["group"]):
            continue  # an account removed since grading
        text = feedback_text(exercise_set, [r for r in rows if r["learner"] == name], when)
        path = Path(pwd.getpwnam(name).pw_dir) / "flash-course" / "feedback" / f"{exercise_set}.txt"
        rc, _, err = as_learner(place, name, _WRITER, [path], text.encode())
        if rc:
            print(f"{name}: feedback not written ({err.splitlines()[-1] if err else rc})")
        else:
            written[name] = path
            print(f"{name}: {path}")
    return written


# -- command line ------------------------------------------------------------------------------

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="workshop.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Run as root. See classroom/README.md.")
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT,
                        help="where the course, its venv, the proxy and the hub's state live (default %(default)s)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("install", help="copy the course for learners, build their venv and the proxy "
                                       "(again after `git pull`: a course update)")
    p.add_argument("--group", help=f"the learners' group (default: the one set before, else {DEFAULT_GROUP})")
    p.add_argument("--python", default=default_python(),
                   help="the Python the learners' venv is built on; every account must be able to run it "
                        "(default %(default)s)")
    p = sub.add_parser("add-learners", help="make an account per name; prints their passwords")
    p.add_argument("names", nargs="+")
    p = sub.add_parser("remove-learners", help="delete learners' accounts AND their homes (collect first)")
    p.add_argument("names", nargs="+")
    p = sub.add_parser("start", help="start the hub in the background")
    p.add_argument("--ip", default="0.0.0.0", help="address learners reach (default %(default)s: every interface)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--hub-port", type=int, default=8081, help="the hub's internal API, on 127.0.0.1")
    p.add_argument("--proxy-api-port", type=int, default=8001, help="the proxy's API, on 127.0.0.1")
    p.add_argument("--admin", action="append", default=[], metavar="NAME",
                   help="an account that may use the hub's admin page (repeatable; none by default)")
    sub.add_parser("stop", help="stop the hub and every learner's server")
    sub.add_parser("status", help="the hub, and which learners have a server")
    for name, what in (("collect", "copy every learner's notebook of a set into state/collected/SET/"),
                       ("grade", "collect, then grade with the sandboxed grader into state/grades/SET.csv"),
                       ("feedback", "write each learner's grades to ~/flash-course/feedback/SET.txt")):
        p = sub.add_parser(name, help=what)
        p.add_argument("exercise_set", metavar="SET", help="e.g. 01_naive_attention")
        if name == "grade":
            p.add_argument("--jobs", type=int, default=2, help="submissions graded at a time (default %(default)s)")
            p.add_argument("--timeout", type=float, help="the grader's --timeout per exercise")
            p.add_argument("--processes", type=int, help="the grader's --processes (the CUDA simulator of set 09 "
                                                         "runs a thread per CUDA thread)")
    args = parser.parse_args(argv)
    place = Place(args.root)
    try:
        if args.command == "install":
            install(place, args.group, args.python)
        elif args.command == "add-learners":
            add_learners(place, args.names)
        elif args.command == "remove-learners":
            remove_learners(place, args.names)
        elif args.command == "start":
            start(place, args.ip, args.port, args.hub_port, args.proxy_api_port, args.admin)
        elif args.command == "stop":
            stop(place)
        elif args.command == "status":
            status(place)
        elif args.command == "collect":
            collect(place, args.exercise_set)
        elif args.command == "grade":
            grade(place, args.exercise_set, args.jobs, args.timeout, args.processes)
        elif args.command == "feedback":
            feedback(place, args.exercise_set)
    except Failed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
