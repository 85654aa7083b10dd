"""Run a workshop of the course on one machine: JupyterHub, one system account per learner.

    sudo python3 classroom/workshop.py install                 # the learners' course, its venv, the proxy
    sudo python3 classroom/workshop.py add-learners ada grace  # accounts; prints each one's password
    sudo python3 classroom/workshop.py add-instructor teacher  # the hub's admin page; never graded
    sudo python3 classroom/workshop.py start                   # the hub on http://<this machine>:8000
    sudo python3 classroom/workshop.py status
    sudo python3 classroom/workshop.py grade 01_naive_attention --deadline 2026-12-02T17:00
    sudo python3 classroom/workshop.py feedback 01_naive_attention  # ~/flash-course/feedback/ of each learner
    sudo python3 classroom/workshop.py gradebook               # every set, late flags, hand marks: one CSV
    sudo python3 classroom/workshop.py restart                 # the hub only: learners keep their servers
    sudo python3 classroom/workshop.py stop

Everything lives under one folder (``--root``, default /opt/flash-course-hub):

    course/   what learners may read: lectures, exercises, course_lib (no solutions/, no tests/)
    venv/     the learners' Python: the course's pins, course_lib, JupyterLab, jupyterhub-singleuser
    proxy/    configurable-http-proxy from npm
    state/    root's alone (0700): settings, hub database and cookie secret, tokens, logs,
              passwords, collected notebooks, grades, hand marks, the gradebook

It must run as root: the hub starts each learner's server as that learner, and only root can.
Only the standard library is used here; grading calls the checkout's ``.venv`` (``make venv``).
This file installs the course and makes the accounts; ``service.py`` runs the hub and its proxy,
``coursework.py`` collects, grades, gives feedback and keeps the gradebook, ``machine.py`` holds
what they share.
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
import secrets
import shutil
import signal
import sqlite3
import sys
from pathlib import Path

import coursework
import service
from machine import (
    DEFAULT_GROUP,
    NAME,
    REPO,
    Failed,
    Place,
    default_python,
    instructor_problem,
    kill,
    learners,
    need_root,
    pids_of_uid,
    readable_solutions,
    readable_solutions_text,
    run,
    runs_as_nobody,
)
from service import HUB_STOP_S, START_DEFAULTS, hub_api, hub_pid

DEFAULT_ROOT = Path("/opt/flash-course-hub")
# What learners get, copied from the checkout; solutions/, tests/ and .git stay with the instructor.
COURSE_PARTS = ("pyproject.toml", "README.md", "course_lib", "notebooks", "exercises",
                "tests/sanitize.cfg", "classroom/learner_start.py", "classroom/jupyterhub_config.py")
# JupyterLab settings every learner gets (no news pop-up, autosave every 30 s), from the venv.
LAB_OVERRIDES = REPO / "classroom" / "overrides.json"
IGNORE = shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints", "*.egg-info", "*.pyc")
# configurable-http-proxy 5.2 and later need Node >= 20; Debian 12's nodejs is 18, which 5.1 supports.
PROXY_PACKAGES = {20: "configurable-http-proxy@5.3.0", 18: "configurable-http-proxy@5.1.0"}


# -- install -----------------------------------------------------------------------------------

def _tree_digest(path: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(path)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


# Run as an account like a learner's: every copy of the course's solutions, exercise tests or
# history it can read, walking from the roots given.  argv: JSON of the solution notebooks'
# names, the roots, the folders not to walk into.  Prints JSON [[path, what], ...].


def install(place: Place, group: str, python: str) -> None:
    """Copy the course for learners, build its venv (only when the pins changed) and the proxy."""
    need_root()
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
    for top, _dirs, files in os.walk(new):
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
    version = run([python, "-c", "import sys; print(sys.version)"])
    stamp = hashlib.sha256((REPO / "pyproject.toml").read_bytes() + version.encode()).hexdigest()
    stamp_file = place.venv / ".installed"
    if not stamp_file.exists() or stamp_file.read_text() != stamp:
        print(f"building the learners' virtual environment in {place.venv} (a few minutes the first time)")
        if not (place.venv / "bin" / "python").exists():
            run([python, "-m", "venv", place.venv])
        py = place.venv / "bin" / "python"
        run([py, "-m", "pip", "install", "-q", "--upgrade", "pip"])
        # Editable, pointing at course/ (which is swapped in place above): a course update needs no
        # reinstall, and learners import exactly the course_lib they can read.
        run([py, "-m", "pip", "install", "-q", "-e", f"{place.course}[hub]"])
        run([py, "-m", "ipykernel", "install", "--sys-prefix", "--name", "python3",
              "--display-name", "Python 3 (FlashAttention course)"])
        stamp_file.write_text(stamp)
    settings_dir = place.venv / "share" / "jupyter" / "lab" / "settings"
    settings_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(LAB_OVERRIDES, settings_dir / "overrides.json")
    run(["chmod", "-R", "go+rX,go-w", place.venv])  # readable by learners, writable by root only
    why = runs_as_nobody([place.venv / "bin" / "python", "-c", "import course_lib, jupyterhub, jupyterlab"])
    if why:
        raise Failed(f"an unprivileged account cannot use {place.venv}: {why}")

    # 3. The proxy.
    if not place.proxy_command().exists():
        node = int(run(["node", "-p", "process.versions.node.split('.')[0]"]).strip())
        package = next((p for major, p in sorted(PROXY_PACKAGES.items(), reverse=True) if node >= major), None)
        if package is None:
            raise Failed(f"Node {node} is too old for the hub's proxy (configurable-http-proxy needs >= 18)")
        print(f"installing {package} from npm into {place.proxy}")
        place.proxy.mkdir(exist_ok=True)
        run(["npm", "install", "--prefix", place.proxy, "--no-audit", "--no-fund", "--loglevel=error", package])

    settings = json.loads(place.settings_file.read_text()) if place.settings_file.exists() else {}
    settings.update(root=str(place.root), group=group or settings.get("group", DEFAULT_GROUP))
    place.save_settings(settings)
    found = readable_solutions(settings["group"], str(place.venv / "bin" / "python"), skip=[place.venv])
    if found:
        print("warning: learners could read these, and `start` will refuse while they can "
              "(move them under /root, or chmod -R o-rwx each):\n" + readable_solutions_text(found))
    print("installed. Next: workshop.py add-learners NAME..., then workshop.py start")


def add_learners(place: Place, names: list) -> dict:
    """Make a system account for each name (home 0700, in the learners' group); return their passwords."""
    need_root()
    group = place.settings()["group"]
    bad = [n for n in names if not NAME.match(n)]
    if bad:
        raise Failed(f"not a usable account name: {', '.join(bad)} (lower-case letters, digits, - and _, "
                     "starting with a letter, at most 31 characters)")
    try:
        grp.getgrnam(group)
    except KeyError:
        run(["groupadd", group])
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
            if name in place.settings().get("instructors", []):
                raise Failed(f"{name} is an instructor of this hub, not a learner: pick another name")
            raise Failed(f"{name} is an existing account on this machine and not a learner: pick another name "
                         "(the hub would hand that account's files to whoever gets the password); for your own "
                         f"account, use `workshop.py add-instructor {name}`")
        passwords[name] = _new_account(name, group, "flash-course learner")
    _hand_out_passwords(place, passwords)
    return passwords


def _new_account(name: str, group: str | None, comment: str) -> str:
    """A system account with a private home (0700), in ``group`` if one is given; its new password."""
    run(["useradd", "--create-home", "--shell", "/bin/bash", *(["--groups", group] if group else []),
          "--key", "HOME_MODE=0700", "--comment", comment, name])
    os.chmod(pwd.getpwnam(name).pw_dir, 0o700)
    password = secrets.token_urlsafe(9)
    run(["chpasswd"], input=f"{name}:{password}\n")
    return password


def _hand_out_passwords(place: Place, passwords: dict) -> None:
    if passwords:
        sheet = place.state / "passwords.csv"
        fd = os.open(sheet, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a", newline="") as f:
            csv.writer(f, lineterminator="\n").writerows(passwords.items())
        for name, password in passwords.items():
            print(f"{name}\t{password}")
        print(f"(also appended to {sheet}, readable by root only)")


def add_instructors(place: Place, names: list) -> dict:
    """Make each name an instructor: the hub lets them in and gives them its admin page; they are not
    learners (not in the learners' group), so nothing of theirs is collected or graded.  A name that is
    not an account yet gets one (home 0700) and a password, printed; an existing account (yours) keeps its own."""
    need_root()
    settings = place.settings()
    passwords = {}
    for name in names:
        try:
            pwd.getpwnam(name)
        except KeyError:
            if NAME.match(name):
                passwords[name] = _new_account(name, None, "flash-course instructor")
        why = instructor_problem(name, settings["group"])
        if why:
            raise Failed(why)
        if name not in settings.setdefault("instructors", []):
            settings["instructors"].append(name)
    place.save_settings(settings)
    _hand_out_passwords(place, passwords)
    print(f"instructors: {', '.join(settings['instructors'])} (at the next `workshop.py start` or `restart`; "
          "the hub's admin page is /hub/admin)")
    return passwords


def remove_learners(place: Place, names: list) -> None:
    """Delete learners' accounts *and their homes* (their work), and the hub's record of them: collect first.

    The hub forgets them too (through its API when it runs, in its database when it does not), or
    it would log an error for each at every start; the learners' group goes with its last member.
    """
    need_root()
    settings = place.settings()
    group = settings["group"]
    strangers = [n for n in names if n not in learners(group)]
    if strangers:
        raise Failed(f"not learners of group {group}: {', '.join(strangers)}; nothing removed")
    running = hub_pid(place) is not None
    for name in names:
        if running:
            code, _ = hub_api(place, settings, "DELETE", f"/users/{name}", timeout=HUB_STOP_S)
            if code not in (204, 404):
                raise Failed(f"the hub refused to delete {name} (HTTP {code}); see {place.state / 'hub.log'}")
        uid = pwd.getpwnam(name).pw_uid
        for pid in pids_of_uid(uid):
            kill(pid, signal.SIGKILL)
        run(["userdel", "--remove", name])
        print(f"{name}: account and home removed")
    if not running:
        forget_in_database(place.state / "jupyterhub.sqlite", names)
    if not learners(group):
        try:
            grp.getgrnam(group)
        except KeyError:
            pass
        else:
            run(["groupdel", group])
            print(f"group {group} removed (it has no learners left)")


def forget_in_database(db: Path, names: list) -> None:
    """Delete users from the hub's database while it is stopped; their servers, tokens and roles go with
    them (the schema's ON DELETE CASCADE, which SQLite applies only with foreign_keys on, as the hub does)."""
    if not db.exists():
        return
    with sqlite3.connect(db) as con:
        con.execute("PRAGMA foreign_keys = ON")
        con.executemany("DELETE FROM users WHERE name = ?", [(n,) for n in names])
    con.close()


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
    p = sub.add_parser("remove-learners", help="delete learners' accounts AND their homes, and the hub's record "
                                               "of them (collect first)")
    p.add_argument("names", nargs="+")
    p = sub.add_parser("add-instructor", help="an account (yours, or a new one) with the hub's admin page; "
                                              "not a learner, never collected or graded")
    p.add_argument("names", nargs="+")
    defaults = ", ".join(f"{k.replace('_', '-')} {v}" for k, v in START_DEFAULTS.items())
    p = sub.add_parser("start", help="start the proxy and the hub in the background",
                       description=f"Options not given are the last start's (the first time: {defaults}).")
    p.add_argument("--ip", help="address learners reach (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, help="the port learners reach")
    p.add_argument("--hub-port", type=int, help="the hub's internal API, on 127.0.0.1")
    p.add_argument("--proxy-api-port", type=int, help="the proxy's API, on 127.0.0.1")
    p.add_argument("--admin", action="append", default=[], metavar="NAME",
                   help="an existing account, not a learner, to make an instructor (as add-instructor; kept)")
    p.add_argument("--accept-readable-solutions", action="store_true",
                   help="start even though learners can read a copy of the solutions (they are listed): for a "
                        "machine with no learners on it, such as a test; never for a class")
    sub.add_parser("restart", help="restart the hub alone: the proxy and the learners' servers keep running")
    sub.add_parser("stop", help="stop every learner's server, the hub and the proxy")
    sub.add_parser("status", help="the hub, and which learners have a server")
    for name, what in (("collect", "copy every learner's notebook of a set, with when it was saved, into "
                                   "state/collected/SET/"),
                       ("grade", "collect, then grade with the sandboxed grader into state/grades/SET.csv"),
                       ("feedback", "write each learner's grades to ~/flash-course/feedback/SET.txt")):
        p = sub.add_parser(name, help=what)
        p.add_argument("exercise_set", metavar="SET", help="e.g. 01_naive_attention")
        if name in ("collect", "grade"):
            p.add_argument("--deadline", help="flag a notebook changed after this as late, e.g. 2026-12-02T17:00 "
                                              "(this machine's time zone unless an offset is given)")
        if name == "grade":
            p.add_argument("--jobs", type=int, default=2, help="submissions graded at a time (default %(default)s)")
            p.add_argument("--timeout", type=float, help="the grader's --timeout per exercise")
            p.add_argument("--processes", type=int, help="the grader's --processes (the CUDA simulator of set 09 "
                                                         "runs a thread per CUDA thread)")
    sub.add_parser("gradebook", help="one CSV of every learner: each graded set, late flags, the hand marks "
                                     "of state/manual.csv, the total")
    args = parser.parse_args(argv)
    place = Place(args.root)
    try:
        if args.command == "install":
            install(place, args.group, args.python)
        elif args.command == "add-learners":
            add_learners(place, args.names)
        elif args.command == "remove-learners":
            remove_learners(place, args.names)
        elif args.command == "add-instructor":
            add_instructors(place, args.names)
        elif args.command == "start":
            service.start(place, {k: getattr(args, k) for k in START_DEFAULTS}, args.admin, args.accept_readable_solutions)
        elif args.command == "restart":
            service.restart(place)
        elif args.command == "stop":
            service.stop(place)
        elif args.command == "status":
            service.status(place)
        elif args.command == "collect":
            coursework.collect(place, args.exercise_set, args.deadline)
        elif args.command == "grade":
            coursework.grade(place, args.exercise_set, args.jobs, args.timeout, args.processes, args.deadline)
        elif args.command == "feedback":
            coursework.feedback(place, args.exercise_set)
        elif args.command == "gradebook":
            coursework.write_gradebook(place)
    except Failed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
