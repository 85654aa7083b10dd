"""A learner's server starts here, already running as the learner (the hub's spawner switched user).

1. Limits: at most FLASH_COURSE_MAX_PROCESSES processes for this account (soft and hard, so
   nothing the learner runs can raise it): a fork bomb in a notebook stops at its own account
   (0: no limit, as in the container image, where the pod's pids limit does it).
2. Their own copy of the course: every file of the course's ``notebooks/`` and ``exercises/``
   that is not yet in ``~/flash-course`` is copied there.  A file they already have is never
   touched, so a course update brings new chapters and sets but never overwrites work; to take
   the course's current version of a notebook, rename yours and restart your server.
   New files are private (umask 077) and the home itself is 0700.  A notebook's
   ``language_info.version`` becomes this Python's: JupyterLab writes the kernel's language_info
   into an open notebook and marks it modified if anything differs, and the kernel runs on this
   interpreter (the course's venv), so a notebook authored on another Python would open as
   modified ("unsaved changes") before the learner typed anything.
3. JupyterLab: ``jupyterhub-singleuser`` of the course's virtual environment, in ``~/flash-course``.

It runs with ``python -I`` (no PYTHONPATH, no user site) and only the standard library.
"""
import json
import os
import resource
import shutil
import sys
from pathlib import Path

COURSE = Path(__file__).resolve().parent.parent   # the installed course (read-only to learners)
HANDED_OUT = ("notebooks", "exercises")
SKIP = {".ipynb_checkpoints", "__pycache__"}


def limit_processes(n: int) -> None:
    # 0 turns it off: in a container (Kubernetes) every learner has the same uid on a node, so a
    # per-uid limit would be shared by all of them; the pod's own pids limit does this job there.
    if n > 0:
        resource.setrlimit(resource.RLIMIT_NPROC, (n, n))


def kernel_python_version() -> str:
    """The version the course's kernel reports in language_info (ipykernel's own expression)."""
    return sys.version.split()[0]


def copy_notebook(src: Path, dst: Path, version: str) -> None:
    """Copy a file; a notebook gets ``language_info.version`` = ``version`` (as nbformat writes JSON)."""
    if src.suffix != ".ipynb":
        shutil.copyfile(src, dst)
        return
    text = src.read_text(encoding="utf-8")
    try:
        nb = json.loads(text)
        info = nb["metadata"]["language_info"]
    except (ValueError, KeyError, TypeError):  # not a notebook we can read: handed out as it is
        info = None
    if isinstance(info, dict) and info.get("version", version) != version:
        info["version"] = version
        text = json.dumps(nb, sort_keys=True, indent=1, ensure_ascii=False) + "\n"
    dst.write_text(text, encoding="utf-8")


def hand_out(course: Path, mine: Path) -> list:
    """Copy what ``mine`` lacks of the course's handed-out folders; return the new paths."""
    new = []
    version = kernel_python_version()
    for part in HANDED_OUT:
        for top, dirs, files in os.walk(course / part):
            dirs[:] = sorted(d for d in dirs if d not in SKIP)
            rel = Path(top).relative_to(course)
            target = mine / rel
            if os.path.lexists(target) and not target.is_dir():
                dirs[:] = []  # the learner put something else here: theirs, left alone
                continue
            target.mkdir(parents=True, exist_ok=True)
            for name in sorted(files):
                if not os.path.lexists(target / name):
                    copy_notebook(Path(top) / name, target / name, version)
                    new.append(rel / name)
    return new


def main() -> None:
    os.umask(0o077)
    limit_processes(int(os.environ.get("FLASH_COURSE_MAX_PROCESSES", "2048")))
    mine = Path.home() / "flash-course"
    mine.mkdir(mode=0o700, exist_ok=True)
    (mine / "feedback").mkdir(mode=0o700, exist_ok=True)
    new = hand_out(COURSE, mine)
    print(f"learner_start: {len(new)} new course file(s) in {mine}", file=sys.stderr, flush=True)
    os.chdir(mine)
    singleuser = Path(sys.executable).parent / "jupyterhub-singleuser"
    os.execv(singleuser, [str(singleuser), f"--ServerApp.root_dir={mine}", *sys.argv[1:]])


if __name__ == "__main__":
    main()
