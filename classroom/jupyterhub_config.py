# JupyterHub for a workshop of the course on one machine; started by `classroom/workshop.py start`.
#
# Every learner is a real system account (made by `workshop.py add-learners`, member of one
# group) and logs in with its own password through PAM.  The hub runs as root and starts each
# learner's JupyterLab *as that learner* (LocalProcessSpawner), so the kernel's own file
# permissions keep learners apart: homes are 0700, nothing of the course install is writable by
# them, the hub's state folder is root's alone.  The hub's settings (address, ports, group,
# instructors) are the ones `start` wrote to settings.json in the state folder named by
# CLASSROOM_STATE.
#
# The proxy and the learners' servers outlive the hub: `workshop.py start` runs the proxy itself,
# and the hub leaves servers running when it stops, so `workshop.py restart` (a new course
# setting, a hub upgrade) goes unnoticed in the learners' tabs.  `workshop.py stop` stops every
# server through the hub's API first, then the hub, then the proxy.
import json
import os
from pathlib import Path

c = get_config()  # noqa: F821 (JupyterHub's config loader defines it)

STATE = Path(os.environ["CLASSROOM_STATE"])
settings = json.loads((STATE / "settings.json").read_text())
ROOT = Path(settings["root"])
COURSE, VENV = ROOT / "course", ROOT / "venv"

# Where it listens: the public port (the proxy), and the hub's and the proxy's own APIs, which
# stay on the loopback (learners on the same machine can reach them, but both want a token).
c.JupyterHub.bind_url = f"http://{settings['ip']}:{settings['port']}"
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = settings["hub_port"]
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{settings['proxy_api_port']}"
c.ConfigurableHTTPProxy.should_start = False  # workshop.py runs it, so it outlives a hub restart
c.ConfigurableHTTPProxy.auth_token = (STATE / "proxy_token").read_text().strip()

# workshop.py's own access to the hub's API: list, stop and delete users and their servers.
c.JupyterHub.services = [{"name": "workshop", "api_token": (STATE / "service_token").read_text().strip()}]
c.JupyterHub.load_roles = [{"name": "workshop", "services": ["workshop"],
                            "scopes": ["list:users", "read:users", "admin:users", "admin:servers"]}]

# Secrets and the database live in the root-only state folder, never in the course.
c.JupyterHub.db_url = f"sqlite:///{STATE / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(STATE / "jupyterhub_cookie_secret")

# Who may log in: members of the learners' group, each with their own password, and the
# instructors (accounts outside that group, so never collected or graded), who also get the hub's
# admin page.  (JupyterHub's shared-password authenticator would let anyone with the class
# password log in as any learner, which undoes the isolation below; it is not used.)
c.JupyterHub.authenticator_class = "pam"
c.PAMAuthenticator.allowed_groups = {settings["group"]}
c.Authenticator.allowed_users = set(settings.get("instructors", []))
c.Authenticator.admin_users = set(settings.get("instructors", []))

# Each learner's server: as the learner, through learner_start.py, which hands out their own
# copy of the course (never overwriting their work) and then runs jupyterhub-singleuser from the
# course's virtual environment, so the kernel is the same "python3" as `make lab`'s.
c.JupyterHub.spawner_class = "localprocess"
c.Spawner.cmd = [str(VENV / "bin" / "python"), "-I", str(COURSE / "classroom" / "learner_start.py")]
c.Spawner.default_url = "/lab/tree/notebooks/00_start_here.ipynb"
# No news fetched.  (The "get notified about Jupyter news?" pop-up is JupyterLab's setting
# fetchNews, turned off in the venv's overrides.json by `install`: news_url alone does not stop it.)
c.Spawner.args = ["--LabApp.news_url=None"]
c.LocalProcessSpawner.env_keep = ["LANG", "LC_ALL"]  # not root's PATH, PYTHONPATH or VIRTUAL_ENV
c.Spawner.environment = {
    "PATH": f"{VENV / 'bin'}:/usr/local/bin:/usr/bin:/bin",
    "VIRTUAL_ENV": str(VENV),
    "FLASH_COURSE_MAX_PROCESSES": str(settings.get("max_processes", 2048)),
}
# A busy shared machine starts JupyterLab slowly; the defaults (60 s / 30 s) are too tight.
c.Spawner.start_timeout = 180
c.Spawner.http_timeout = 120
# A server whose learner comes back to a stopped one (after `workshop.py stop` and `start`) starts
# again by itself after 3 s, instead of waiting on a "Launch Server" button.
c.JupyterHub.implicit_spawn_seconds = 3
# The hub leaves the learners' servers running when it stops (see the top: `stop` ends them).
c.JupyterHub.cleanup_servers = False
