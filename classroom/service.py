"""The hub as a service: the proxy and JupyterHub started, restarted and stopped by ``workshop.py``.

The proxy is run here, not by the hub, and the hub leaves servers running when it stops
(``jupyterhub_config.py``): ``restart`` replaces the hub alone while learners keep their tabs,
kernels and unsaved work.  ``stop`` stops every server through the hub's API, then the hub, then
the proxy.
"""
from __future__ import annotations

import json
import os
import pwd
import secrets
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

from machine import (
    DEFAULT_GROUP,
    Failed,
    Place,
    cmdline,
    instructor_problem,
    kill,
    learners,
    need_root,
    pids_of_uid,
    readable_solutions,
    readable_solutions_text,
)

# `start`'s options: given ones are kept for the next start, missing ones are the last start's.
START_DEFAULTS = {"ip": "0.0.0.0", "port": 8000, "hub_port": 8081, "proxy_api_port": 8001}
HUB_START_S = 120
HUB_STOP_S = 90


def hub_pid(place: Place) -> int | None:
    """The running hub's pid, if the pid file names a live jupyterhub with our config."""
    try:
        pid = int((place.state / "hub.pid").read_text())
    except (OSError, ValueError):
        return None
    cmd = cmdline(pid)
    if any(a.endswith("jupyterhub") for a in cmd) and str(place.course / "classroom" / "jupyterhub_config.py") in cmd:
        return pid
    return None


def proxy_pid(place: Place) -> int | None:
    """The running proxy's pid, if the pid file names a live configurable-http-proxy of this install."""
    try:
        pid = int((place.state / "proxy.pid").read_text())
    except (OSError, ValueError):
        return None
    return pid if str(place.proxy_command()) in cmdline(pid) else None


def start_settings(saved: dict, given: dict) -> dict:
    """The settings a start uses: each option given, else the last start's, else its default."""
    settings = dict(saved)
    for key, default in START_DEFAULTS.items():
        if given.get(key) is not None:
            settings[key] = given[key]
        settings.setdefault(key, default)
    return settings


def local_url(settings) -> str:
    """Where this machine reaches the hub (through the proxy)."""
    host = "127.0.0.1" if settings["ip"] in ("", "0.0.0.0") else settings["ip"]
    return f"http://{host}:{settings['port']}"


def public_urls(settings) -> list:
    """Where learners reach the hub: the address it binds, or for every interface, this machine's
    name and its address on the network (the one its default route leaves from; no packet is sent)."""
    if settings["ip"] not in ("", "0.0.0.0"):
        return [f"http://{settings['ip']}:{settings['port']}"]
    hosts = [socket.getfqdn()]
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: routes like the internet, and connect() sends nothing
            hosts.append(s.getsockname()[0])
    except OSError:
        pass
    hosts = [h for h in dict.fromkeys(hosts) if h and h != "localhost" and not h.startswith("127.")]
    return [f"http://{h}:{settings['port']}" for h in hosts] or [f"http://127.0.0.1:{settings['port']} (this "
                                                                 "machine has no other address)"]


def log_tail(place: Place, lines=30, log="hub.log") -> str:
    try:
        return "\n".join((place.state / log).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _secret(place: Place, name: str) -> str:
    """A token in state/ (made once, root's alone): the proxy's API token, workshop.py's hub token."""
    path = place.state / name
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
    return path.read_text().strip()


def hub_api(place: Place, settings: dict, method: str, path: str, timeout=30):
    """Call the hub's REST API as workshop.py's service; (HTTP status, JSON reply or None)."""
    request = urllib.request.Request(f"http://127.0.0.1:{settings['hub_port']}/hub/api{path}", method=method,
                                     headers={"Authorization": f"token {_secret(place, 'service_token')}"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            body = reply.read()
            return reply.status, json.loads(body) if body else None
    except urllib.error.HTTPError as exc:
        return exc.code, None


def _proxy_argv(place: Place, settings: dict) -> list:
    hub = f"http://127.0.0.1:{settings['hub_port']}"
    return [str(place.proxy_command()), "--ip", settings["ip"], "--port", str(settings["port"]),
            "--api-ip", "127.0.0.1", "--api-port", str(settings["proxy_api_port"]),
            "--default-target", hub, "--error-target", f"{hub}/hub/error"]


def start_proxy(place: Place, settings: dict) -> None:
    """Run the proxy (kept if it already runs with these settings): it outlives a hub restart."""
    argv = _proxy_argv(place, settings)
    pid = proxy_pid(place)
    if pid and cmdline(pid)[-len(argv):] == argv:
        return
    if pid:
        _end(pid, "the proxy (its address or ports changed)")
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "CONFIGPROXY_AUTH_TOKEN": _secret(place, "proxy_token")}
    with open(place.state / "proxy.log", "ab") as log:
        proxy = subprocess.Popen(argv, cwd=place.state, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    (place.state / "proxy.pid").write_text(f"{proxy.pid}\n")
    request = urllib.request.Request(f"http://127.0.0.1:{settings['proxy_api_port']}/api/routes",
                                     headers={"Authorization": f"token {env['CONFIGPROXY_AUTH_TOKEN']}"})
    deadline = time.monotonic() + 30
    while True:
        if proxy.poll() is not None:
            raise Failed(f"the proxy exited with {proxy.returncode}; its log ({place.state / 'proxy.log'}) ends:\n"
                         + log_tail(place, log="proxy.log"))
        try:
            with urllib.request.urlopen(request, timeout=5):
                return
        except OSError as err:
            if time.monotonic() > deadline:
                raise Failed("the proxy did not answer within 30 s; its log ends:\n"
                             + log_tail(place, log="proxy.log")) from err
            time.sleep(0.3)


def _start_hub(place: Place, settings: dict) -> int:
    env = {"PATH": f"{place.venv / 'bin'}:/usr/local/bin:/usr/bin:/bin", "CLASSROOM_STATE": str(place.state),
           "LANG": os.environ.get("LANG", "C.UTF-8")}
    with open(place.state / "hub.log", "ab") as log:
        hub = subprocess.Popen([place.venv / "bin" / "jupyterhub", "-f",
                                place.course / "classroom" / "jupyterhub_config.py"],
                               cwd=place.state, env=env, stdin=subprocess.DEVNULL, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    (place.state / "hub.pid").write_text(f"{hub.pid}\n")
    deadline = time.monotonic() + HUB_START_S
    while True:
        if hub.poll() is not None:
            raise Failed(f"the hub exited with {hub.returncode}; its log ({place.state / 'hub.log'}) ends:\n"
                         + log_tail(place))
        try:
            with urllib.request.urlopen(f"{local_url(settings)}/hub/health", timeout=5) as reply:
                if reply.status == 200:
                    return hub.pid
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise Failed(f"the hub did not answer within {HUB_START_S} s; its log ends:\n" + log_tail(place))
        time.sleep(0.5)


def start(place: Place, options: dict, admins: list = (), accept_readable_solutions=False) -> list:
    """Start the proxy and the hub in the background; return the URLs learners use once it answers.

    Options not given are the last start's (then START_DEFAULTS'); ``admins`` become instructors.
    Refuses while a copy of the solutions is readable by learners, naming it.
    """
    need_root()
    if hub_pid(place):
        raise Failed(f"the hub is already running (pid {hub_pid(place)}); `workshop.py stop` first, "
                     "or `workshop.py restart`")
    if not place.proxy_command().exists() or not (place.venv / "bin" / "jupyterhub").exists():
        raise Failed(f"nothing installed at {place.root}: run `workshop.py install` first")
    settings = start_settings(place.settings(), options)
    for name in admins:
        why = instructor_problem(name, settings["group"])
        if why:
            raise Failed(f"--admin {name}: {why}")
        if name not in settings.setdefault("instructors", []):
            settings["instructors"].append(name)
    print("looking for copies of the solutions that learners could read (a few seconds)")
    found = readable_solutions(settings["group"], str(place.venv / "bin" / "python"), skip=[place.venv])
    if found and not accept_readable_solutions:
        raise Failed("learners could read these, so the hub does not start:\n" + readable_solutions_text(found)
                     + "\nMove each where they cannot (under /root, say) or `chmod -R o-rwx` it, then start again.")
    if found:
        print("warning: started although learners can read:\n" + readable_solutions_text(found))
    place.save_settings(settings)
    _secret(place, "service_token")
    start_proxy(place, settings)
    pid = _start_hub(place, settings)
    urls = public_urls(settings)
    print(f"the hub is up at {' and '.join(urls)} (pid {pid}; log {place.state / 'hub.log'}); "
          f"learners of group {settings['group']} log in with their passwords"
          + (f"; instructors: {', '.join(settings.get('instructors', []))}" if settings.get("instructors") else ""))
    return urls


def _end(pid: int, what: str, wait=HUB_STOP_S) -> None:
    """SIGTERM, then SIGKILL after ``wait`` seconds."""
    kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait
    while cmdline(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if cmdline(pid):
        print(f"{what} (pid {pid}) did not stop within {wait} s: killing it")
        kill(pid, signal.SIGKILL)


def restart(place: Place) -> None:
    """Stop and start the hub alone, with its settings: the proxy and every server keep running, so a
    learner's open tab, kernel and unsaved work go on; the hub's pages are away for a few seconds."""
    need_root()
    settings = place.settings()
    pid = hub_pid(place)
    if pid is None:
        raise Failed("the hub is not running: `workshop.py start`")
    _end(pid, "the hub")
    pid = _start_hub(place, settings)
    print(f"the hub restarted (pid {pid}); learners' servers kept running")


def _stop_servers(place: Place, settings: dict) -> None:
    """Ask the hub to stop every running server, and wait until it says they stopped."""
    code, users = hub_api(place, settings, "GET", "/users")
    if code != 200:
        print(f"the hub's API answered {code}: servers are stopped below instead")
        return
    running = [u["name"] for u in users if u.get("servers")]
    deadline, asked = time.monotonic() + HUB_STOP_S, 0.0
    while running and time.monotonic() < deadline:
        if time.monotonic() - asked > 10:  # asked again every 10 s: a server still starting may not stop at once
            for name in running:
                hub_api(place, settings, "DELETE", f"/users/{name}/server")
            asked = time.monotonic()
        time.sleep(0.5)
        code, users = hub_api(place, settings, "GET", "/users")
        running = [u["name"] for u in users or [] if u.get("servers")]
    if running:
        print(f"servers still stopping after {HUB_STOP_S} s: {', '.join(running)}")


def stop(place: Place) -> None:
    """Stop every server (through the hub), then the hub and the proxy. Stragglers are killed and named."""
    need_root()
    settings = place.settings()
    pid = hub_pid(place)
    if pid is None:
        print("the hub is not running")
    else:
        _stop_servers(place, settings)
        _end(pid, "the hub")
        print("the hub stopped")
    (place.state / "hub.pid").unlink(missing_ok=True)
    pid = proxy_pid(place)
    if pid:
        _end(pid, "the proxy", wait=10)
    (place.state / "proxy.pid").unlink(missing_ok=True)
    # What the hub should have ended: every process of every learner, every instructor's server.
    left = [p for name in learners(settings.get("group", DEFAULT_GROUP)) for p in pids_of_uid(pwd.getpwnam(name).pw_uid)]
    for name in settings.get("instructors", []):
        try:
            uid = pwd.getpwnam(name).pw_uid
        except KeyError:
            continue
        left += [p for p in pids_of_uid(uid) if str(place.root) in " ".join(cmdline(p))]
    for p in left:
        print(f"still running after the hub stopped, killed: pid {p} {' '.join(cmdline(p))[:120]}")
        kill(p, signal.SIGKILL)


def status(place: Place) -> None:
    settings = place.settings()
    pid = hub_pid(place)
    print(f"hub: {'running at ' + ' and '.join(public_urls(settings)) + f' (pid {pid})' if pid else 'not running'}")
    if settings.get("instructors"):
        print(f"instructors: {', '.join(settings['instructors'])}")
    for name in learners(settings["group"]):
        n = len(pids_of_uid(pwd.getpwnam(name).pw_uid))
        print(f"  {name}: {f'{n} process(es)' if n else 'no server'}")
