"""The workshop's machine: its folders, its accounts and their processes, and what a learner can reach.

The instructor's commands (``workshop.py``) and the hub's (``service.py``, ``coursework.py``) share
these.  Only the standard library; run as root.
"""
from __future__ import annotations

import grp
import json
import os
import pwd
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_GROUP = "flash-learners"
NAME = re.compile(r"^[a-z][a-z0-9_-]{0,30}$")


class Failed(Exception):
    """A step failed; the message says what to do."""


class Place:
    """The install's folders: course/ (what learners read), venv/, proxy/, state/ (root's alone)."""

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


def run(argv, **kwargs):
    """Run a command; on failure raise Failed with the end of its output."""
    done = subprocess.run([str(a) for a in argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, **kwargs)
    if done.returncode:
        raise Failed(f"{' '.join(map(str, argv))} exited with {done.returncode}:\n{done.stdout[-3000:]}")
    return done.stdout


def need_root():
    if os.geteuid() != 0:
        raise Failed("run this as root (sudo): the hub starts each learner's server as that learner, "
                     "and accounts are made with useradd")


def learners(group: str) -> list:
    """The learners: the members of ``group``, sorted."""
    try:
        return sorted(grp.getgrnam(group).gr_mem)
    except KeyError:
        return []


def instructor_problem(name: str, group: str) -> str | None:
    """Why ``name`` cannot be an instructor of the hub (None if it can): a learner would be graded as one."""
    if not NAME.match(name):
        return f"{name!r} is not a usable account name"
    if name in learners(group):
        return (f"{name} is a learner (a member of {group}): the hub would collect and grade their work with "
                "the class. Make the instructor an account of its own: `workshop.py add-instructor NAME`")
    try:
        if pwd.getpwnam(name).pw_uid == 0:
            return f"{name} is root: the hub will not start a server as root"
    except KeyError:
        return f"{name} is not an account on this machine: `workshop.py add-instructor {name}` makes one"
    return None


def cmdline(pid: int) -> list:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def pids_of_uid(uid: int) -> list:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def kill(pid: int, sig) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


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


# Run as an account like a learner's: every copy of the course's solutions, exercise tests or
# history it can read, walking from the roots given.  argv: JSON of the solution notebooks'
# names, the roots, the folders not to walk into.  Prints JSON [[path, what], ...].
_SEEKER = r"""
import json, os, sys
names, roots, skip = set(json.loads(sys.argv[1])), json.loads(sys.argv[2]), set(json.loads(sys.argv[3]))
PRUNE = {"site-packages", "node_modules", "__pycache__", ".git", ".ipynb_checkpoints"}
def readable(folder, pick):
    try:
        paths = sorted(e.path for e in os.scandir(folder) if pick(e.name))
    except OSError:
        return None
    for path in paths:
        try:
            with open(path, "rb") as f:
                f.read(1)
            return path
        except OSError:
            pass
    return None
found, stack = [], list(roots)
while stack:
    top = stack.pop()
    try:
        with os.scandir(top) as it:
            dirs = {e.name: e.path for e in it if e.is_dir(follow_symlinks=False)}
    except OSError:
        continue
    if "solutions" in dirs:
        hit = readable(dirs["solutions"], lambda n: n in names)
        if hit:
            found.append([dirs["solutions"], "the solutions (" + os.path.basename(hit) + " can be read)"])
    if "course_lib" in dirs and ".git" in dirs and readable(dirs[".git"], lambda n: n == "HEAD"):
        found.append([dirs[".git"], "the course's git history, which holds the solutions"])
    if "course_lib" in dirs and "tests" in dirs:
        hit = readable(dirs["tests"], lambda n: n.startswith("test_exercise") and n.endswith(".py"))
        if hit:
            found.append([dirs["tests"], "the exercise tests, which quote the solutions"])
    stack += [p for n, p in dirs.items() if n not in PRUNE and p not in skip]
print(json.dumps(sorted(found)))
"""
NOT_WALKED = ["/proc", "/sys", "/dev", "/run"]


def readable_solutions(group: str, python: str, roots=("/",), skip=()) -> list:
    """[(path, what)] of every copy of the solutions (or the course's history or exercise tests) that a
    learner could read: the walk runs as an unprivileged account (nobody) in the learners' group."""
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        gid = 65534
    names = sorted(p.name for p in (REPO / "solutions").glob("*.ipynb"))
    done = subprocess.run([python, "-I", "-S", "-c", _SEEKER, json.dumps(names), json.dumps(list(map(str, roots))),
                           json.dumps(NOT_WALKED + [str(p) for p in skip])],
                          user=65534, group=gid, extra_groups=[], cwd="/", env={"PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise Failed(f"looking for readable copies of the solutions failed: {done.stderr.strip()[-500:]}")
    return [tuple(x) for x in json.loads(done.stdout)]


def readable_solutions_text(found: list) -> str:
    lines = [f"  {path}: {what}" for path, what in found[:30]]
    if len(found) > 30:
        lines.append(f"  ... and {len(found) - 30} more")
    return "\n".join(lines)
