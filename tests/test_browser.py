"""A real browser: JupyterLab serves every lecture, headless Chromium opens and runs each one.

What a learner would see is checked: opening a notebook does not mark it
modified, Run All ends without an error output, every widget renders (no
"Error displaying widget", no "Loading widget..." left), the explorers of
chapters 02, 03 and 06 answer a control, and a stored exercise notebook shows
no PASS under its unsolved stubs.  The server is started on a free localhost
port with an empty token, over a temporary folder holding *copies* of the
notebooks, so nothing the browser does can write into the committed ones.
Chromium is Debian's ``chromium`` package, driven by Playwright; without it the
tests are skipped and say so.  Screenshots are kept under ``test-artifacts/``.

One test needs no browser: a terminal of the JupyterLab that ``make lab``
starts runs the course's Python (``python -m course_lib.grade`` works there).
"""
from __future__ import annotations

import contextlib
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

from conftest import CHROMIUM, CHROMIUM_ARGS, REPO

LECTURES = sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb"))
EXERCISE = "01_naive_attention.ipynb"  # the stored exercise notebook opened as a learner first sees it
ARTIFACTS = REPO / "test-artifacts"
SERVER_START_S = 120  # generous: the machine running the tests may be slow and busy
RUN_ALL_S = 400  # chapter 09 runs CUDA kernels in the simulator
SLIDER_S = 120

pytestmark = [pytest.mark.needs_chromium, pytest.mark.timeout(900)]


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
    for name in LECTURES:
        shutil.copy(REPO / "notebooks" / name, root / name)
    shutil.copytree(REPO / "notebooks" / "records", root / "records")  # the benchmark records chapters plot
    (root / "exercises").mkdir()
    shutil.copy(REPO / "exercises" / EXERCISE, root / "exercises" / EXERCISE)
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


OPEN = """async (name) => {
    const panel = window.jupyterapp.shell.currentWidget;
    await panel.context.ready;
    await panel.sessionContext.ready;
    // JupyterLab writes the kernel it started into the metadata: a stored kernelspec that differs marks the
    // notebook modified at once.  Give the kernel's info a moment to arrive before asking.
    for (let i = 0; i < 50 && !(panel.sessionContext.session && panel.sessionContext.session.kernel
                                 && panel.sessionContext.session.kernel.info); i++) {
        await new Promise(r => setTimeout(r, 100));
    }
    if (panel.sessionContext.session && panel.sessionContext.session.kernel) {
        await panel.sessionContext.session.kernel.info;
    }
    await new Promise(r => setTimeout(r, 1000));
    return panel.context.model.dirty;
}"""

REPORT = """() => {
    // What the notebook's outputs hold and what the page shows of them, cell by cell.
    const panel = window.jupyterapp.shell.currentWidget;
    const errors = [], widgets = [], notRun = [];
    panel.content.widgets.forEach((cell, index) => {
        if (cell.model.type !== 'code') return;
        if (cell.model.executionCount === null) notRun.push(index);
        const outputs = cell.model.outputs.toJSON();
        outputs.forEach(o => {
            if (o.output_type === 'error') errors.push(`cell ${index}: ${o.ename}: ${o.evalue}`);
            if (o.data && o.data['application/vnd.jupyter.widget-view+json']) {
                const area = cell.node.querySelector('.jp-OutputArea');
                const text = area ? area.textContent : '';  // not innerText: cells out of view are not laid out
                const views = cell.node.querySelectorAll('.jp-OutputArea-output .jupyter-widgets.widget-box, '
                                                         + '.jp-OutputArea-output .widget-image');
                widgets.push({cell: index, rendered: views.length > 0,
                              broken: text.includes('Error displaying widget') || text.includes('Loading widget')});
            }
        });
    });
    return {errors, widgets, notRun};
}"""


@contextlib.contextmanager
def _page():
    """A fresh page (1500 x 1100) in Debian's Chromium, closed with its browser on the way out; skips the
    test where playwright is missing."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="real-browser test skipped: playwright missing")
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser.new_page(viewport={"width": 1500, "height": 1100})
        finally:
            browser.close()


def _open(page, url, path):
    """Open ``path`` in a fresh workspace; returns whether JupyterLab marked it modified just by opening it."""
    page.goto(f"{url}/lab/tree/{path}?reset", timeout=SERVER_START_S * 1000)
    page.wait_for_function("(name) => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
                           " return w && w.sessionContext && w.context && w.context.path === name; }",
                           arg=path, timeout=SERVER_START_S * 1000)
    return page.evaluate(OPEN, path)


def _run_all(page, notebook, log):
    """Run All, wait for the last cell, and return REPORT; fails with a screenshot if it does not finish."""
    sync_api = pytest.importorskip("playwright.sync_api")
    page.evaluate("""() => {
        window.__ranAll = false;  // the command's promise settles when the last cell's reply is in
        window.jupyterapp.commands.execute('notebook:run-all-cells')
            .then(() => { window.__ranAll = true; }, () => { window.__ranAll = true; });
    }""")
    try:
        page.wait_for_function("() => window.__ranAll === true && window.jupyterapp.shell.currentWidget"
                               ".sessionContext.session.kernel.status === 'idle'",
                               timeout=RUN_ALL_S * 1000, polling=1000)
        page.wait_for_timeout(3000)  # widget views render after their models arrive
    except sync_api.TimeoutError:
        page.screenshot(path=str(ARTIFACTS / f"browser_{Path(notebook).stem}_timeout.png"), full_page=True)
        pytest.fail(f"{notebook}: Run All did not finish within {RUN_ALL_S} s; screenshot in test-artifacts/\n"
                    f"{_log_tail(log)}")
    return page.evaluate(REPORT)


def _check_report(notebook, report):
    assert report["errors"] == [], f"{notebook}: error outputs after Run All: {report['errors']}"
    assert report["notRun"] == [], f"{notebook}: cells Run All never reached: {report['notRun']}"
    broken = [w for w in report["widgets"] if w["broken"] or not w["rendered"]]
    assert broken == [], f"{notebook}: widgets that did not render: {broken}"


def _explore(lab, notebook, explorer_class, first_text, move, expected_text, shot):
    """Open ``notebook``, run all its cells, wait for the explorer, ``move(page, explorer)`` a control.

    Returns (summary before, summary after, figure src before, figure src after);
    fails if opening marks the notebook modified, a cell errs, a widget does not
    render, the explorer never appears or its output does not change.
    """
    url, _, log = lab
    committed = (REPO / "notebooks" / notebook).read_bytes()
    with _page() as page:
        sync_api = pytest.importorskip("playwright.sync_api")  # for its TimeoutError
        page.set_default_timeout(SLIDER_S * 1000)
        assert _open(page, url, notebook) is False, f"opening {notebook} marked it modified"
        _check_report(notebook, _run_all(page, notebook, log))

        explorer = page.locator(f".{explorer_class}")
        summary = explorer.locator(".explorer-summary")
        figure = explorer.locator(".explorer-figure")
        try:  # the explorer is there once Run All is done, and its summary once computed
            summary.filter(has_text=first_text).wait_for(state="visible", timeout=SLIDER_S * 1000)
        except sync_api.TimeoutError:
            page.screenshot(path=str(ARTIFACTS / f"{shot}_timeout.png"), full_page=True)
            pytest.fail(f"{explorer_class} did not appear; screenshot in test-artifacts/\n{_log_tail(log)}")
        # JupyterLab skips rendering cells far from the viewport (content-visibility): bring it into view
        # and wait until the page really shows the summary before reading it
        explorer.scroll_into_view_if_needed()
        page.wait_for_function("([selector, text]) => { const el = document.querySelector(selector);"
                               " return el && el.innerText.includes(text); }",
                               arg=[f".{explorer_class} .explorer-summary", first_text], timeout=SLIDER_S * 1000)
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
    assert (REPO / "notebooks" / notebook).read_bytes() == committed  # the browser only ever saw a copy
    return before, after, before_figure, after_figure


EXPLORED = {"02_roofline.ipynb", "03_tiling_and_sram.ipynb", "06_masks.ipynb"}  # the tests below run these


@pytest.mark.parametrize("notebook", [n for n in LECTURES if n not in EXPLORED], ids=lambda n: n[:2])
def test_a_lecture_opens_unmodified_and_runs_without_errors(lab, notebook):
    url, _, log = lab
    with _page() as page:
        assert _open(page, url, notebook) is False, f"opening {notebook} marked it modified"
        report = _run_all(page, notebook, log)
        page.screenshot(path=str(ARTIFACTS / f"browser_{notebook[:2]}_after_run_all.png"))
    _check_report(notebook, report)


def test_a_stored_exercise_shows_no_pass_under_its_stubs(lab):
    """A learner who opens a fresh exercise notebook must not see PASS before writing a line."""
    url, _, _ = lab
    with _page() as page:
        assert _open(page, url, f"exercises/{EXERCISE}") is False, "opening the exercise marked it modified"
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=SERVER_START_S * 1000)
        shown = page.evaluate("""() => {
            const panel = window.jupyterapp.shell.currentWidget;
            // The outputs the page renders under each answer (stub) and check cell, from the notebook's own
            // model: JupyterLab does not lay out cells far from the viewport, so their innerText reads ''.
            const texts = [];
            panel.content.widgets.forEach(cell => {
                const tags = (cell.model.getMetadata && cell.model.getMetadata('tags')) || [];
                if (cell.model.type !== 'code' || !(tags.includes('check') || tags.includes('answer'))) return;
                texts.push(cell.model.outputs.toJSON().map(o => [].concat(o.text || [], o.evalue || [],
                    (o.data && o.data['text/plain']) || []).join('')).join(' | '));
            });
            return {texts, cells: panel.content.widgets.length,
                    stubs: panel.content.widgets.filter(c => c.model.type === 'code'
                        && c.model.sharedModel.getSource().includes('raise NotImplementedError')).length};
        }""")
        page.screenshot(path=str(ARTIFACTS / "browser_exercise_01_opened.png"))
    assert shown["stubs"] >= 6 and shown["cells"] > shown["stubs"] and len(shown["texts"]) == 2 * shown["stubs"]
    assert not any("PASS" in text for text in shown["texts"]), [t for t in shown["texts"] if "PASS" in t]


def test_chapter_03_tile_explorer_answers_a_slider(lab):
    def move_br(page, explorer):
        explorer.locator(".control-block_q .noUi-handle").focus()
        page.keyboard.press("ArrowRight")  # Br: 64 -> 128

    before, after, fig_before, fig_after = _explore(
        lab, "03_tiling_and_sram.ipynb", "tile-size-explorer", "small run", move_br, "tile Br=128",
        "browser_03_explorer")
    assert "tile Br=64 Bc=64" in before, before
    assert "tile Br=128 Bc=64" in after and after != before, after
    assert fig_before and fig_after and fig_after != fig_before  # the figure was redrawn too


def test_chapter_02_roofline_explorer_answers_a_dropdown(lab):
    def pick_l4(page, explorer):
        explorer.locator(".control-hardware select").select_option(label="NVIDIA L4")

    before, after, fig_before, fig_after = _explore(
        lab, "02_roofline.ipynb", "roofline-explorer", "this machine", pick_l4, "NVIDIA L4", "browser_02_explorer")
    assert before.startswith("NVIDIA H100 SXM"), before
    assert after.startswith("NVIDIA L4") and after != before, after
    assert fig_before and fig_after and fig_after != fig_before


def test_chapter_06_tile_map_redraws_when_a_slider_is_released(lab):
    def move_bc(page, explorer):
        explorer.locator(".widget-slider").nth(3).locator(".noUi-handle").focus()  # Nq, Nk, Br, Bc: Bc
        page.keyboard.press("ArrowLeft")  # Bc: 16 -> 15

    before, after, fig_before, fig_after = _explore(
        lab, "06_masks.ipynb", "tile-map-explorer", "computed", move_bc, "tiles", "browser_06_tile_map")
    assert after != before and fig_before and fig_after and fig_after != fig_before


# -- no browser: the terminal of the JupyterLab that `make lab` starts ---------------------------

def test_a_terminal_of_make_lab_runs_the_course_python(tmp_path):
    """`python -m course_lib.grade` in a JupyterLab terminal must not fail with "No module named 'nbformat'"."""
    import asyncio
    import json
    import shutil as sh

    from tornado.websocket import websocket_connect

    if not sh.which("make") or not (REPO / ".venv" / "bin" / "jupyter").exists():
        pytest.skip("needs make and the course's .venv")
    port = _free_port()
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "ws"),
               JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "settings"),
               PATH="/usr/local/bin:/usr/bin:/bin")  # a learner's shell, without the venv
    token = "terminal-test"  # a token, not an empty one: a POST without it would need the browser's XSRF cookie
    args = f"--no-browser --port={port} --ServerApp.port_retries=0 --IdentityProvider.token={token} --ServerApp.ip=127.0.0.1"
    with open(tmp_path / "lab.log", "wb") as out:
        server = subprocess.Popen(["make", "-s", "lab", f"LAB_ARGS={args}"], cwd=REPO, env=env, stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=5):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"make lab did not serve:\n{_log_tail(tmp_path / 'lab.log')}")
                time.sleep(1)
        request = urllib.request.Request(f"{url}/api/terminals?token={token}", method="POST", data=b"{}",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as reply:
            name = json.load(reply)["name"]

        async def run_in_terminal(command, until):
            ws = await websocket_connect(f"ws://127.0.0.1:{port}/terminals/websocket/{name}?token={token}")
            await ws.write_message(json.dumps(["stdin", command + "\r"]))
            seen = ""
            end = time.monotonic() + 60
            while until not in seen and time.monotonic() < end:
                message = await asyncio.wait_for(ws.read_message(), 60)
                if message is None:
                    break
                kind, *payload = json.loads(message)
                if kind == "stdout":
                    seen += payload[0]
            ws.close()
            return seen

        seen = asyncio.run(run_in_terminal(
            "cd exercises && python -m course_lib.grade --help | head -1 && echo TERMINAL-$((6*7))", "TERMINAL-42"))
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
    assert "TERMINAL-42" in seen, seen
    assert "usage: python -m course_lib.grade" in seen and "No module named" not in seen, seen
