"""A real browser: JupyterLab serves chapters 03 and 02, headless Chromium runs them and moves a control.

The server is started on a free localhost port with an empty token, over a
temporary folder holding *copies* of the chapters, so nothing the browser does
can write into the committed notebooks.  Chromium is Debian's ``chromium``
package, driven by Playwright; without it the tests are skipped and say so.
Screenshots of each explorer before and after its control moved are kept
under ``test-artifacts/``.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
NOTEBOOKS = ("03_tiling_and_sram.ipynb", "02_roofline.ipynb")
ARTIFACTS = REPO / "test-artifacts"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-dev-shm-usage"]
SERVER_START_S = 120  # generous: the machine running the tests may be slow and busy
RUN_ALL_S = 300
SLIDER_S = 120

pytestmark = [
    pytest.mark.skipif(not os.path.exists(CHROMIUM),
                       reason=f"real-browser test skipped: {CHROMIUM} not found "
                              "(install Debian's 'chromium' package; .ci/run does)"),
    pytest.mark.timeout(600),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no server log)"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab over temporary copies of the chapters; yields its base URL and stops it afterwards."""
    root = tmp_path_factory.mktemp("lab")
    for name in NOTEBOOKS:
        shutil.copy(REPO / "notebooks" / name, root / name)
    private = tmp_path_factory.mktemp("jupyter")
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(private / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(private / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(private / "workspaces"),
               MPLBACKEND="module://matplotlib_inline.backend_inline")
    port = _free_port()
    log = private / "server.log"
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--IdentityProvider.token=", "--ServerApp.ip=127.0.0.1",
           f"--port={port}", "--ServerApp.port_retries=0", f"--ServerApp.root_dir={root}",
           "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=None"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # CI containers run as root
        cmd.append("--allow-root")
    with open(log, "wb") as out:
        server = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=root,
                                  start_new_session=True)  # its own process group: kernels included
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if server.poll() is not None:
                pytest.fail(f"JupyterLab exited with {server.returncode}:\n{_log_tail(log)}")
            try:
                with urllib.request.urlopen(f"{url}/api/status", timeout=5) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"JupyterLab did not answer within {SERVER_START_S} s:\n{_log_tail(log)}")
            time.sleep(1)
        yield url, root, log
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)  # the server we started, and its kernels
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait(timeout=30)


def _explore(lab, notebook, explorer_class, first_text, move, expected_text, shot):
    """Open ``notebook``, run all its cells, wait for the explorer, ``move(page, explorer)`` a control.

    Returns (summary before, summary after, figure src before, figure src after);
    fails if the explorer never appears or its output does not change.
    """
    sync_api = pytest.importorskip("playwright.sync_api", reason="real-browser test skipped: playwright missing")
    url, _, log = lab
    committed = (REPO / "notebooks" / notebook).read_bytes()
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1100})
            page.set_default_timeout(SLIDER_S * 1000)
            page.goto(f"{url}/lab/tree/{notebook}?reset", timeout=SERVER_START_S * 1000)  # a fresh workspace
            page.wait_for_function("(name) => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
                                   " return w && w.sessionContext && w.context && w.context.path === name; }",
                                   arg=notebook, timeout=SERVER_START_S * 1000)
            page.evaluate("""async () => {
                const panel = window.jupyterapp.shell.currentWidget;
                await panel.context.ready;
                await panel.sessionContext.ready;
            }""")
            page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")

            explorer = page.locator(f".{explorer_class}")
            summary = explorer.locator(".explorer-summary")
            figure = explorer.locator(".explorer-figure")
            try:  # the explorer appears once Run All reaches it, and its summary once computed
                summary.filter(has_text=first_text).wait_for(state="visible", timeout=RUN_ALL_S * 1000)
            except sync_api.TimeoutError:
                page.screenshot(path=str(ARTIFACTS / f"{shot}_timeout.png"), full_page=True)
                pytest.fail(f"{explorer_class} did not appear within {RUN_ALL_S} s; "
                            f"screenshot in test-artifacts/\n{_log_tail(log)}")
            before, before_figure = summary.inner_text(), figure.get_attribute("src")
            explorer.screenshot(path=str(ARTIFACTS / f"{shot}_before.png"))

            move(page, explorer)
            try:
                page.wait_for_function(
                    "([selector, old, expected]) => { const el = document.querySelector(selector);"
                    " return el && el.innerText !== old && el.innerText.includes(expected); }",
                    arg=[f".{explorer_class} .explorer-summary", before, expected_text], timeout=SLIDER_S * 1000)
            except sync_api.TimeoutError:
                page.screenshot(path=str(ARTIFACTS / f"{shot}_no_change.png"), full_page=True)
                pytest.fail(f"moving a control of {explorer_class} did not change its output within {SLIDER_S} s")
            after, after_figure = summary.inner_text(), figure.get_attribute("src")
            explorer.screenshot(path=str(ARTIFACTS / f"{shot}_after.png"))
        finally:
            browser.close()
    assert (REPO / "notebooks" / notebook).read_bytes() == committed  # the browser only ever saw a copy
    return before, after, before_figure, after_figure


def test_chapter_03_runs_in_jupyterlab_and_its_tile_explorer_answers_a_slider(lab):
    def move_br(page, explorer):
        explorer.locator(".control-block_q .noUi-handle").focus()
        page.keyboard.press("ArrowRight")  # Br: 64 -> 128

    before, after, fig_before, fig_after = _explore(
        lab, "03_tiling_and_sram.ipynb", "tile-size-explorer", "small run", move_br, "tile Br=128",
        "browser_03_explorer")
    assert "tile Br=64 Bc=64" in before, before
    assert "tile Br=128 Bc=64" in after and after != before, after
    assert fig_before and fig_after and fig_after != fig_before  # the figure was redrawn too


def test_chapter_02_runs_in_jupyterlab_and_its_roofline_explorer_answers_a_dropdown(lab):
    def pick_l4(page, explorer):
        explorer.locator(".control-hardware select").select_option(label="NVIDIA L4")

    before, after, fig_before, fig_after = _explore(
        lab, "02_roofline.ipynb", "roofline-explorer", "this machine", pick_l4, "NVIDIA L4", "browser_02_explorer")
    assert before.startswith("NVIDIA H100 SXM"), before
    assert after.startswith("NVIDIA L4") and after != before, after
    assert fig_before and fig_after and fig_after != fig_before
