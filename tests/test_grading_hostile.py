"""The grader holds under a hostile class: what one submission does never reaches the host, the
grader or another submission.

Memory a sandbox holds outside its processes' resident sets (memfds, System V shared memory,
socket and pipe buffers, tmpfs files), CPU time spread over many processes and sessions, the
grader's environment, kernel keys, the grader's own memory (what it parses of a reply, of an
answer cell), text an answer chooses in the reports, workers left behind by a killed grader,
an exercise charged for another's answer, and links among the submissions.  The memory, CPU and
environment tests run with each kind of sandbox: a root grader's (``setpriv``: a uid of its
own), a user namespace started by root, and a grader that is not root (run here as nobody).
"""
from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import pytest

from course_lib.grading import cli, pipeline, sandbox, seccomp
from course_lib.grading.submission import Course

import notebook_factory as nf
from conftest import REPO

pytestmark = pytest.mark.needs_sandbox

ROOT = os.geteuid() == 0
MODES = ["setpriv", "userns", "nobody"] if ROOT else ["userns"]
LIMIT = 256 * 2**20          # --memory of the memory tests: 0.25 GB
TARGET = 2 * LIMIT           # what each holder tries to hold

# Runs sandboxes and reports what each call gave: in this process, or as nobody (a grader that is not root).
RUNNER = """
import json, sys
from course_lib.grading import sandbox

def run(spec):
    limits, out, session = sandbox.Limits(**spec.get("limits", {})), [], None
    try:
        for name, args in spec["calls"]:
            if session is None:
                session = sandbox.Session(limits, userns=spec["userns"])
                session.exec(spec["cells"], timeout=60)
            try:
                out.append(["value", session.call(name, args, {}, timeout=spec.get("timeout", 60))])
            except sandbox.Died as exc:
                out.append(["died", exc.reason])
                session.close()
                session = None
            except sandbox.AnswerRaised as exc:
                out.append(["raised", exc.error.get("name", "") + ": " + exc.error.get("message", "")])
            except sandbox.Timeout:
                out.append(["timeout", ""])
                session.close()
                session = None
    finally:
        if session is not None:
            session.close()
    return out

if __name__ == "__main__":
    print(json.dumps(run(json.loads(sys.argv[1]))))
"""


def run_calls(mode, cells, calls, env=None, **spec):
    """[[kind, value]] of each (name, args) of ``calls``, in sandboxes of ``mode`` that ran ``cells``."""
    spec = dict(spec, cells=cells, calls=calls, userns=mode != "setpriv")
    if mode != "nobody":
        namespace = {"__name__": "runner"}
        exec(RUNNER, namespace)
        return namespace["run"](spec)
    with tempfile.TemporaryDirectory() as spare:
        done = subprocess.run(_as_nobody([sys.executable, "-B", "-c", RUNNER, json.dumps(spec)], spare),
                              capture_output=True, text=True, timeout=300, cwd="/",
                              env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), **(env or {})})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def _as_nobody(argv, spare):
    """``argv`` run as nobody. Where the Python lies under a folder only root may enter (``/root``,
    with pyenv), that folder is an empty tmpfs in a mount namespace of the run's own, with the
    folder of the Python bound back in it: nothing changes on the host."""
    real = Path(os.path.realpath(sys.executable)).resolve()
    closed = next((p for p in reversed(real.parents) if p != Path("/") and os.stat(p).st_mode & 0o005 != 0o005), None)
    drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"]
    if closed is None:
        return drop + argv
    inner = real.parents[len(real.parents) - len(closed.parts) - 1]   # the child of ``closed`` on the way
    script = ('set -e; mount --bind "$1" "$3"; mount -t tmpfs -o mode=0755,size=1m none "$2"; mkdir -p "$1"; '
              'mount --bind "$3" "$1"; shift 3; exec "$@"')
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(inner), str(closed),
            spare, *drop, *argv]


# -- memory the watch cannot see ---------------------------------------------------------------

HOLDERS = """import ctypes, fcntl, os, socket, time
CHUNK = b"x" * 2**20

def _fill(write, target):
    held = 0
    try:
        while held < target:
            held += write()
    except OSError:
        pass
    return held

def memfd(target):
    fds = []
    def write():
        if not fds or os.fstat(fds[-1]).st_size >= 32 * 2**20:   # each under the file-size limit
            fds.append(os.memfd_create("hold"))
        return os.write(fds[-1], CHUNK)
    return _fill(write, target), fds

def sysv_shm(target):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    ids = []
    def write():
        shmid = libc.shmget(0, 32 * 2**20, 0o1600)           # IPC_PRIVATE, IPC_CREAT | 0600
        if shmid < 0:
            raise OSError(ctypes.get_errno(), "shmget")
        ids.append(shmid)
        address = libc.shmat(shmid, None, 0)
        ctypes.memset(address, 1, 32 * 2**20)
        libc.shmdt(ctypes.c_void_p(address))                  # held, and in no process's memory
        return 32 * 2**20
    return _fill(write, target), ids

def sockets(target):
    pairs = []
    def write():
        a, b = socket.socketpair()
        pairs.append((a, b))
        a.setblocking(False)
        sent = 0
        try:
            while True:
                sent += a.send(CHUNK)
        except BlockingIOError:
            return sent
    return _fill(write, target), pairs

def pipes(target):
    fds = []
    def write():
        r, w = os.pipe()
        fds.extend((r, w))
        try:
            fcntl.fcntl(w, 1031, 2**20)                       # F_SETPIPE_SZ
        except OSError:
            pass
        os.set_blocking(w, False)
        sent = 0
        try:
            while True:
                sent += os.write(w, CHUNK)
        except BlockingIOError:
            return sent
    return _fill(write, target), fds

def tmpfs(target, folder="/tmp"):
    files = []
    def write():
        path = f"{folder}/hold{len(files)}"
        files.append(path)
        with open(path, "wb") as f:
            for _ in range(16):
                f.write(CHUNK)
        return 16 * 2**20
    return _fill(write, target), files

def dev_shm(target):
    return tmpfs(target, "/dev/shm")

def hold(kind, target):
    held, keep = globals()[kind](target)
    time.sleep(0.6)              # the watch looks every 0.25 s
    return held
"""
KINDS = ["memfd", "sysv_shm", "sockets", "pipes", "tmpfs", "dev_shm"]


@pytest.mark.parametrize("mode", MODES)
def test_no_sandbox_holds_more_memory_than_its_limit_outside_its_processes(mode):
    """memfds, System V segments and socket buffers were invisible to the watch: a submission held
    6 GB under a 4 GB limit. Each is refused now; pipes and tmpfs files stay small."""
    results = run_calls(mode, [HOLDERS], [("hold", [kind, TARGET]) for kind in KINDS],
                        limits={"memory_bytes": LIMIT})
    held = dict(zip(KINDS, results))
    for kind, (outcome, value) in held.items():
        assert outcome == "died" and "--memory" in value or outcome == "value" and value < LIMIT / 2, (kind, held)
    assert held["memfd"] == ["value", 0] and held["sysv_shm"] == ["value", 0] and held["sockets"] == ["value", 0]


# -- CPU ---------------------------------------------------------------------------------------

SESSIONS = """import os, time
def sessions(n):
    pids = []
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            try:
                os.setsid()
            except OSError:
                pass
            os._exit(0 if os.getsid(0) == os.getpid() else 1)
        pids.append(pid)
    return sum(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0 for pid in pids)

def namespaces(clone):
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    refused = []
    for call in (lambda: libc.unshare(0x10000000), lambda: libc.syscall(clone, 0x10000000 | 17, 0, 0, 0, 0)):
        result = call()                   # CLONE_NEWUSER: a user namespace, where mounts are allowed
        if result == 0 and os.getpid() != PARENT:
            os._exit(0)                   # a child that clone made
        refused.append(result == -1 and ctypes.get_errno() == 1)
    return refused

PARENT = os.getpid()

def spin(children, seconds):
    pids = []
    for _ in range(children):
        pid = os.fork()
        if pid == 0:
            while time.process_time() < seconds:
                pass
            os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
    return os.times().children_user + os.times().children_system
"""


@pytest.mark.parametrize("mode", MODES)
def test_a_sandbox_is_one_session_and_its_processes_share_one_cpu_budget(mode):
    """40 busy children, each in a session of its own, took the CPU from a neighbour (the kernel
    shares CPU between sessions); each within RLIMIT_CPU, together far over it. Now no process of a
    sandbox leaves its session, and the CPU time of all of them together is bounded."""
    clone = seccomp.NUMBERS[seccomp.machine()][1]["clone"]
    (made, leaving), (tried, refused), (spun, value) = run_calls(
        mode, [SESSIONS], [("sessions", [4]), ("namespaces", [clone]), ("spin", [3, 0.8])], limits={"cpu_seconds": 1})
    assert (made, leaving) == ("value", 0)
    assert (tried, refused) == ("value", [True, True])   # nor a namespace of its own, to start a session in
    assert spun == "died" and "CPU time" in value and "limit of 1 s" in value, (spun, value)


# -- the grader's environment ------------------------------------------------------------------

SECRET = f"course-grade-secret-{os.getpid()}"
ENVIRON = """import os
def environ():
    found = [dict(os.environ)]
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                found.append(open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace"))
            except OSError:
                pass
    return str(found)
"""


@pytest.mark.parametrize("mode", MODES)
def test_nothing_of_the_graders_environment_is_readable_inside(mode, monkeypatch):
    """bubblewrap's init, pid 1 of a user-namespace sandbox, kept the grader's environment in
    /proc/1/environ, readable by the answer."""
    monkeypatch.setenv("COURSE_GRADE_SECRET", SECRET)
    [(outcome, seen)] = run_calls(mode, [ENVIRON], [("environ", [])], env={"COURSE_GRADE_SECRET": SECRET})
    assert outcome == "value" and "HOME" in seen   # the sandbox's own environment was read
    assert SECRET not in seen


# -- kernel keys -------------------------------------------------------------------------------

KEYS = """import ctypes
libc = ctypes.CDLL(None, use_errno=True)
def add(nr, name):
    return libc.syscall(nr, b"user", name.encode(), b"hello", 5, -4)   # KEY_SPEC_USER_KEYRING
def find(nr, name):
    return libc.syscall(nr, 10, -4, b"user", name.encode(), 0)          # KEYCTL_SEARCH
"""


@pytest.mark.needs_root("sandboxes reuse host uids only under a root grader")
def test_a_key_dies_with_its_sandbox():
    """A key added to a uid's keyring stayed there for the next sandbox of that uid."""
    numbers = seccomp.NUMBERS[seccomp.machine()][1]
    name = f"course-grade-{os.getpid()}"
    with sandbox.Session(sandbox.Limits(), userns=False) as first:
        first.exec([KEYS], timeout=60)
        added = first.call("add", [numbers["add_key"], name], {}, timeout=60)
        uid = first.uid
    deadline = time.monotonic() + 10
    while uid in sandbox._uids_running() and time.monotonic() < deadline:   # its processes end just after it
        time.sleep(0.1)
    with sandbox.Session(sandbox.Limits(), userns=False) as second:
        second.exec([KEYS], timeout=60)
        found = second.call("find", [numbers["keyctl"], name], {}, timeout=60)
        assert second.uid == uid        # the uid was reused, as it is in a batch
    assert added == -1 and found == -1, (added, found)


# -- the grader's own memory -------------------------------------------------------------------

BOMB = """import json, os, struct, sys
def bomb(items):
    body = ("[" + "{}," * items + "{}]").encode()
    header = b'{"seq": 2, "ok": true, "sizes": [], "value": ' + body + b"}"
    os.write(int(sys.argv[2]), struct.pack("!Q", len(header)) + header)
    return None
"""


@pytest.mark.parametrize("items", [2 * 10**6, 4 * 10**6], ids=["many-nodes", "over-the-header-limit"])
def test_a_reply_of_many_small_values_costs_the_grader_little(items):
    """``{},`` x N cost about 26 times its size to parse: 128 MiB became 3.4 GB of the grader's."""
    with sandbox.Session(sandbox.Limits()) as session:
        session.exec([BOMB], timeout=60)
        tracemalloc.start()
        try:
            with pytest.raises(sandbox.wire.WireError, match=r"over the .* a reply may have"):
                session.call("bomb", [items], {}, timeout=60)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < 40 * 2**20, peak


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    return nf.make_course(tmp_path_factory.mktemp("course"), {nf.SYNTHETIC: nf.synthetic_solution()})


def _submission(course, folder, name, answers):
    nb = nf.read(course / "solutions" / f"{nf.SYNTHETIC}.ipynb")
    for exercise, source in answers.items():
        nf.cells(nb, "answer", exercise)[0].source = source
    return nf.write(nb, folder / f"{name}.ipynb")


def test_an_answer_cell_too_large_to_read_is_refused_before_it_runs(course, tmp_path):
    """A 16 MiB cell of constants was run, then parsed twice by the kernel reader: 4.7 GB, 117 s."""
    constants = "table = [" + ",".join(["1.5"] * 300_000) + "]\n"
    path = _submission(course, tmp_path, "constants", {"1.3": constants + "n_bytes = 160"})
    start = time.monotonic()
    [result] = pipeline.grade_all([path], Course(course), pipeline.Options(timeout=30))
    assert time.monotonic() - start < 60
    rows = {r.exercise: (r.status, r.reason) for r in result.rows}
    assert rows["1.1"] == ("pass", "") and rows["1.2"] == ("pass", "")
    assert rows["1.3"][0] == "invalid" and "KiB an answer cell may have" in rows["1.3"][1], rows


# -- reports -----------------------------------------------------------------------------------

FORGER = ("Forged = type('=HYPERLINK(\"http://x\")\\n  1.2       pass      2 / 2\\n  total  6 / 6', (Exception,), {})\n"
          "def scores(q, k):\n    raise Forged('\\r@SUM(1+1)')")


def test_answer_chosen_text_is_one_short_csv_safe_line_in_every_report(course, tmp_path, monkeypatch):
    """An exception's class name went into the reason as it was: a formula in a spreadsheet,
    forged rows in the table. So did a submission's file name."""
    _submission(course, tmp_path, "=1+1", {"1.1": FORGER})
    monkeypatch.chdir(tmp_path)   # the instructor runs the grader beside the files: ``grade *.ipynb``
    [result] = pipeline.grade_all(["=1+1.ipynb"], Course(course), pipeline.Options(timeout=30))
    table = cli.format_result(result)
    assert len(table.splitlines()) == 2 + len(result.rows) + 1, table
    assert all(len(line) <= 400 for line in table.splitlines())
    out = tmp_path / "grades.csv"
    cli.write_csv([result], out)
    with open(out, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    assert len(rows) == 1 + len(result.rows)
    cells = [c for row in rows for c in row]
    assert not [c for c in cells if c[:1] in ("=", "+", "-", "@", "\t", "\r")], rows
    assert not [c for c in cells if "\n" in c or "\r" in c], rows
    assert "HYPERLINK" in rows[1][6]     # the reason is still there, made harmless


# -- a killed grader ---------------------------------------------------------------------------

def _descendants(root):
    children = {}
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except (OSError, ValueError):
            continue
        if entry.isdigit():
            children.setdefault(int(stat[stat.rfind(b")") + 2:].split()[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] != b"Z"


def test_the_workers_of_a_killed_grader_die_with_it(course, tmp_path):
    """With --jobs 2, a killed grader left its pool workers and their sandboxes grading. SIGKILL
    here: no handler of the grader's runs, and SIGTERM ends it the same way (it has none)."""
    slow = {"1.1": "import time\ntime.sleep(60)\ndef scores(q, k):\n    return q @ k.T"}
    paths = [_submission(course, tmp_path, f"slow{i}", slow) for i in range(2)]
    grader = subprocess.Popen([sys.executable, "-m", "course_lib.grade", *map(str, paths), "--jobs", "2",
                               "--timeout", "100", "--course-root", str(course)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ, PYTHONPATH=str(REPO)))
    seen = []
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            seen = _descendants(grader.pid)
            if sum(_cmdline(p).split(b"\0")[1:4] == [b"-I", b"-B", b"/grader/worker.py"] for p in seen) >= 2:
                break
            time.sleep(0.5)
        else:
            pytest.fail("the grader never started two sandboxes")
        grader.send_signal(signal.SIGKILL)
        grader.wait(30)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and [p for p in seen if _alive(p)]:
            time.sleep(0.25)
        assert not [p for p in seen if _alive(p)]
    finally:
        for pid in [grader.pid] + [p for p in seen if _alive(p)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        grader.wait()


# -- misattribution ----------------------------------------------------------------------------

LATE_DEATH = ("import os, sys\nwire = sys.modules['wire']\nunpack, seen = wire.unpack, [0]\n"
              "def dying(stream):\n    seen[0] += 1\n    if seen[0] > 2:\n        os._exit(1)\n"
              "    return unpack(stream)\nwire.unpack = dying\n"
              "def scores(q, k):\n    return q @ k.T")


def test_an_exercise_is_charged_only_for_its_own_answer(course, tmp_path):
    """1.1's answer ends its process two requests after its own check, in 1.2's: 1.2 was charged."""
    path = _submission(course, tmp_path, "late_death", {"1.1": LATE_DEATH})
    [result] = pipeline.grade_all([path], Course(course), pipeline.Options(timeout=30))
    rows = {r.exercise: (r.status, r.reason) for r in result.rows}
    assert rows["1.2"] == ("pass", "") and rows["1.3"] == ("pass", ""), rows


# -- the instructor's side ---------------------------------------------------------------------

def test_links_among_the_submissions_are_refused_and_said_so(course, tmp_path):
    """A symbolic link to the course's solution, put among the submissions, scored full marks."""
    solution = course / "solutions" / f"{nf.SYNTHETIC}.ipynb"
    (tmp_path / "alice.ipynb").symlink_to(solution)
    os.link(_submission(course, tmp_path, "mine", {}), tmp_path / "bob.ipynb")
    results = pipeline.grade_all([tmp_path / "alice.ipynb", tmp_path / "bob.ipynb"], Course(course),
                                 pipeline.Options(timeout=30))
    for result, words in zip(results, ["refused: a symbolic link", "refused: a hard link"]):
        assert result.total[0] == 0, result
        assert result.rows and all(r.status == "invalid" and words in r.reason for r in result.rows), result


# -- a class with hogs in it -------------------------------------------------------------------

CPU_HOG = ("import os\nfor _ in range(40):\n    if os.fork() == 0:\n        try:\n            os.setsid()\n"
           "        except OSError:\n            pass\n        os.execv('/bin/sh', ['sh', '-c', 'while :; do :; done'])\n"
           "while True:\n    pass")
MEMFD_HOG = ("import os\nfds = []\nfor _ in range(32):\n    fds.append(os.memfd_create('hold'))\n"
             "    for _ in range(32):\n        os.write(fds[-1], b'x' * 2**20)\n"
             "def scores(q, k):\n    return q @ k.T")
JSON_BOMB = ("import os, struct, sys\ndef scores(q, k):\n    header = b'{\"seq\": 2, \"ok\": true, \"sizes\": [], \"value\": [' "
             "+ b'{},' * (4 * 2**20) + b'{}]}'\n    os.write(int(sys.argv[2]), struct.pack('!Q', len(header)) + header)")


def test_a_batch_with_hogs_grades_every_honest_neighbour_in_time_with_full_marks(course, tmp_path):
    """Nine submissions, two at a time: a CPU hog (40 busy processes, each trying a session of its
    own), a memfd hog (1 GB under --memory 0.5) and a JSON bomb (a 12 MiB reply of ``{},``) among
    six honest ones. A CPU hog made an honest neighbour take 114.6 s instead of 5.3 s, and lose
    points to --timeout 5; here every honest one keeps full marks within --timeout 5."""
    hostile = {"cpu_hog": {"1.1": CPU_HOG}, "memfd_hog": {"1.1": MEMFD_HOG}, "json_bomb": {"1.1": JSON_BOMB}}
    paths = [_submission(course, tmp_path, name, answers) for name, answers in hostile.items()]
    paths[1:1] = [_submission(course, tmp_path, f"honest{i}", {}) for i in range(6)]
    options = pipeline.Options(timeout=5, limits=sandbox.Limits(memory_bytes=2**29))
    start = time.monotonic()
    results = pipeline.grade_all(paths, Course(course), options, jobs=2)
    took = time.monotonic() - start
    by_name = {os.path.basename(r.submission)[:-6]: r for r in results}
    print(f"batch of {len(paths)} in {took:.1f} s; " + ", ".join(f"{name} {r.seconds:.1f} s {r.total[0]}/{r.total[1]}"
                                                                 for name, r in by_name.items()))
    for name, result in by_name.items():
        if name.startswith("honest"):
            assert result.total == (6, 6), result
        else:
            assert [r.status for r in result.rows][0] != "pass", result
    assert by_name["cpu_hog"].rows[0].status == "timeout", by_name["cpu_hog"]
    assert "PermissionError" in by_name["memfd_hog"].rows[0].reason
    assert "a reply may have" in by_name["json_bomb"].rows[0].reason


def test_the_readme_says_the_bounds_the_sandbox_and_the_grader_hold():
    from course_lib.grading import wire

    readme = (REPO / "README.md").read_text()
    said = " ".join(readme.split("## Grading")[1].split("\n## ")[0].split())
    limits = sandbox.Limits()
    for words in (f"private `/tmp` ({limits.tmp_bytes // 2**20} MiB)", f"{limits.open_files} open files per process",
                  f"{limits.cpu_seconds} s of CPU time for all its processes together",
                  f"`--memory`, {limits.memory_bytes // 2**30} GB by default", "no cgroup is used",
                  f"an answer cell over {pipeline.MAX_ANSWER_BYTES // 2**10} KiB is not run",
                  f"header is over {wire.MAX_HEADER // 2**20} MiB or a million values", "memfds", "sockets"):
        assert words in said, words
    assert wire.MAX_VALUES == 10**6
