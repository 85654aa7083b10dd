"""The course's website (`make site`) in a real browser, served from localhost with the network cut.

The site is built once per session by `make site` (Sphinx's incremental build: quick when nothing
changed) and served on 127.0.0.1.  Every request to another host is blocked and counted as a
failure, so a script, font or style from a CDN fails the test the way it would fail at a workshop
with no internet.  Every lecture page must load with no failed request, every image decoded, all its
math typeset (no raw ``$...$`` left in the text) and previous / next linking the chapters in order;
search must find a term of chapter 12.  Chromium is Debian's, driven by Playwright; without it the
browser tests are skipped and say so.  Screenshots of three pages are kept under ``test-artifacts/``.
"""
from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import importlib.util
import io
import json
import re
import shutil
import subprocess
import tarfile
import threading
from pathlib import Path
from urllib.parse import urljoin, urlparse

import pytest

from conftest import CHROMIUM, CHROMIUM_ARGS, REPO

SITE = REPO / "_build" / "html"
LECTURES = sorted(p.stem for p in (REPO / "notebooks").glob("*.ipynb"))
EXERCISES = sorted(p.stem for p in (REPO / "exercises").glob("*.ipynb"))
WIDGET_TEXT = "run this cell in JupyterLab to move its controls"  # a widget's stored text/plain (FigureBox)
SEARCH_TERM = "Jacobian"  # chapter 12's softmax backward; no other lecture says it
ARTIFACTS = REPO / "test-artifacts"
BUILD_S = 900  # from nothing on a busy 2-core machine; an unchanged site takes seconds
PAGE_S = 60

pytestmark = pytest.mark.timeout(BUILD_S + 300)


@pytest.fixture(scope="session")
def site():
    """The site, built (or brought up to date) by `make site`."""
    if shutil.which("make") is None:
        pytest.skip("the website test needs make, which builds the site")
    built = subprocess.run(["make", "-s", "site"], cwd=REPO, capture_output=True, text=True, timeout=BUILD_S)
    assert built.returncode == 0, f"make site failed:\n{built.stdout[-4000:]}\n{built.stderr[-4000:]}"
    return SITE


@pytest.fixture(scope="module")
def served(site):
    """The base URL of a server for the site on 127.0.0.1."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"real-browser test skipped: {CHROMIUM} is missing")
    sync_api = pytest.importorskip("playwright.sync_api", reason="real-browser test skipped: playwright missing")
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


class Visit:
    """A page of the site opened in a fresh tab; ``failures`` lists every request that failed or left localhost."""

    def __init__(self, browser, base):
        self.base = base
        self.failures = []
        self.page = browser.new_page(viewport={"width": 1400, "height": 1000})
        self.page.set_default_timeout(PAGE_S * 1000)
        self.page.route("**/*", self._route)
        self.page.on("requestfailed", lambda r: self.failures.append(f"failed: {r.url} ({r.failure})"))
        self.page.on("response", lambda r: r.status >= 400 and self.failures.append(f"HTTP {r.status}: {r.url}"))

    def _route(self, route):
        url = route.request.url
        if url.startswith(self.base) or url.startswith("data:"):
            route.continue_()
        else:
            self.failures.append(f"left localhost: {url}")
            route.abort()

    def open(self, path):
        self.page.goto(urljoin(self.base, path), wait_until="load")
        return self.page

    def close(self):
        self.page.close()


@pytest.fixture()
def visit(browser, served):
    v = Visit(browser, served)
    yield v
    v.close()


# What a page shows once MathJax is done: its images, the math left untypeset, raw TeX in the text,
# prev / next, the run box, the widget notes and the widest table.
INSPECT = r"""async () => {
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
    const images = Array.from(document.images);
    await Promise.all(images.map(img => img.complete ? null : new Promise(done => {
        img.addEventListener('load', done); img.addEventListener('error', done); })));
    const untypeset = Array.from(document.querySelectorAll('.math'))
        .filter(el => !el.querySelector('mjx-container')).map(el => el.textContent.slice(0, 80));
    const article = document.querySelector('article') || document.body;
    const walker = document.createTreeWalker(article, NodeFilter.SHOW_TEXT, {acceptNode: node =>
        node.parentElement.closest('pre, code, script, style, mjx-container, .highlight')
            ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT});
    const raw = [];
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
        // the prose writes $ only around math: one left in the text is TeX that MathJax never saw
        if (/\$|\\\(|\\\[/.test(node.textContent)) raw.push(node.textContent.trim().slice(-120));
    }
    const link = sel => { const a = document.querySelector(sel); return a ? a.href : null; };
    const box = document.querySelector('.run-this-chapter');
    const scroller = t => {  // the nearest box around the table that scrolls sideways
        for (let el = t; el && el !== article; el = el.parentElement)
            if (['auto', 'scroll'].includes(getComputedStyle(el).overflowX)) return el.className || el.tagName;
        return null; };
    const tables = Array.from(article.querySelectorAll('table')).map(t => {
        const cell = getComputedStyle(t.querySelector('td, th'));
        return {scroller: scroller(t), wordBreak: cell.wordBreak, wrap: cell.overflowWrap,
                head: t.innerText.slice(0, 60)}; });
    return {
        images: images.map(img => ({src: img.src, width: img.naturalWidth})),
        outputImages: article.querySelectorAll('.cell_output img').length,
        untypeset, raw,
        prev: link('a.left-prev'), next: link('a.right-next'),
        runBox: box ? box.innerText : null,
        widgetNotes: document.querySelectorAll('.widget-note').length,
        tables,
        pageOverflow: document.documentElement.scrollWidth - window.innerWidth,
    };
}"""


def _figures(lecture):
    """(PNG outputs, of which widgets' stored figures) in the committed notebook."""
    pngs = [o["data"] for cell in json.loads((REPO / "notebooks" / f"{lecture}.ipynb").read_text())["cells"]
            for o in cell.get("outputs", []) if "image/png" in o.get("data", {})]
    return len(pngs), sum(WIDGET_TEXT in "".join(d.get("text/plain", "")) for d in pngs)


def _page_of(url):
    return urlparse(url).path.rsplit("/", 1)[-1].removesuffix(".html") if url else None


@pytest.mark.needs_chromium
@pytest.mark.parametrize("lecture", LECTURES, ids=lambda name: name[:2])
def test_a_lecture_page_loads_offline_with_its_figures_math_and_neighbours(visit, lecture):
    page = visit.open(f"notebooks/{lecture}.html")
    shown = page.evaluate(INSPECT)
    assert visit.failures == [], f"{lecture}: requests that failed or left localhost: {visit.failures}"
    broken = [img["src"] for img in shown["images"] if img["width"] == 0]
    assert broken == [], f"{lecture}: images that did not load: {broken}"
    figures, widgets = _figures(lecture)
    assert shown["outputImages"] == figures, f"{lecture}: {shown['outputImages']} figures shown, {figures} stored"
    assert shown["untypeset"] == [], f"{lecture}: math MathJax did not typeset: {shown['untypeset'][:5]}"
    assert shown["raw"] == [], f"{lecture}: raw TeX left in the text: {shown['raw'][:5]}"

    i = LECTURES.index(lecture)
    assert _page_of(shown["prev"]) == (LECTURES[i - 1] if i else "index"), (lecture, shown["prev"])
    if i + 1 < len(LECTURES):
        assert _page_of(shown["next"]) == LECTURES[i + 1], (lecture, shown["next"])

    assert shown["runBox"] and f"notebooks/{lecture}.ipynb" in shown["runBox"] and "make lab" in shown["runBox"]
    assert shown["widgetNotes"] == widgets, f"{lecture}: {shown['widgetNotes']} notes under {widgets} widgets"
    for table in shown["tables"]:  # a wide table scrolls inside the page; its words never break
        assert table["scroller"] and table["wordBreak"] == "normal" and table["wrap"] == "normal", (lecture, table)
    assert shown["pageOverflow"] <= 0, f"{lecture}: the page itself scrolls sideways by {shown['pageOverflow']} px"


@pytest.mark.needs_chromium
def test_search_finds_a_term_of_chapter_12(visit):
    page = visit.open(f"search.html?q={SEARCH_TERM}")
    page.wait_for_selector("#search-results ul.search li a")
    found = page.eval_on_selector_all("#search-results ul.search li a", "links => links.map(a => a.href)")
    assert any(_page_of(url) == "12_backward" for url in found), found
    assert visit.failures == [], visit.failures


@pytest.mark.needs_chromium
def test_three_pages_look_right_in_a_screenshot(visit):
    """Landing, chapter 02 at its first displayed formula, chapter 10 at its widest table: kept to look at."""
    ARTIFACTS.mkdir(exist_ok=True)
    page = visit.open("index.html")
    page.screenshot(path=str(ARTIFACTS / "site_landing.png"), full_page=True)
    page = visit.open("notebooks/02_roofline.html")
    page.evaluate(INSPECT)
    page.locator("div.math").first.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "site_02_math.png"))
    page = visit.open("notebooks/10_gpu_performance.html")
    page.evaluate(INSPECT)
    page.evaluate("""() => { const t = Array.from(document.querySelectorAll('article table'))
        .sort((a, b) => b.scrollWidth - a.scrollWidth)[0]; t.scrollIntoView({block: 'start'}); window.scrollBy(0, -80); }""")
    page.screenshot(path=str(ARTIFACTS / "site_10_table.png"))
    assert visit.failures == [], visit.failures


def test_the_site_has_every_exercise_set_and_no_solution(site):
    """One page per exercise set, the student copy: its stubs are there and no answer is."""
    pages = sorted(p.stem for p in (site / "exercises").glob("*.html"))
    assert pages == EXERCISES
    assert not (site / "solutions").exists()
    for name in EXERCISES:
        text = (site / "exercises" / f"{name}.html").read_text()
        assert "YOUR CODE HERE" in text and "BEGIN SOLUTION" not in text, name
    assert not re.search(r"BEGIN SOLUTION", "".join(p.read_text() for p in site.rglob("*.html")))


def _mathjax_module():
    spec = importlib.util.spec_from_file_location("site_mathjax", REPO / "docs" / "mathjax.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tarball(members):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_mathjax_is_unpacked_only_when_its_sha512_is_the_pinned_one(tmp_path, monkeypatch):
    mathjax = _mathjax_module()
    blob = _tarball({"package/es5/tex-mml-chtml.js": b"MathJax", "package/es5/output/chtml/fonts/a.woff": b"font",
                     "package/es5/tex-svg.js": b"never loaded", "package/README.md": b"readme"})
    monkeypatch.setattr(mathjax, "INTEGRITY", "sha512-" + base64.b64encode(hashlib.sha512(blob).digest()).decode())
    with pytest.raises(SystemExit, match="not MathJax"):
        mathjax.install(tmp_path / "bad", blob[:-1] + bytes([blob[-1] ^ 1]))  # one bit changed
    assert not (tmp_path / "bad" / "mathjax").exists()
    target = mathjax.install(tmp_path / "good", blob)
    kept = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    assert kept == [".version", "output/chtml/fonts/a.woff", "tex-mml-chtml.js"]
    assert mathjax.install(tmp_path / "good", b"not even a tarball") == target  # kept: not fetched again
