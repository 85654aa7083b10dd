"""`make site`: the course as a static website in ``_build/html``, from the notebooks as committed.

Sphinx reads its pages from one source folder, and the lectures, the exercise sets and these pages
live in three.  ``_build/site-src`` joins them with links (``notebooks/``, ``exercises/``, the
pages of ``docs/`` and the README they quote), so nothing is copied and a changed notebook is
seen by Sphinx's incremental build.  ``solutions/`` is never linked: the site shows the student
copies only.  Warnings are errors: a page that renders wrong should fail the build, not ship.

Every page is written each time (``-a``), though only changed notebooks are read again: each page
carries the sidebar of all chapters and its previous / next links, and Sphinx would otherwise
leave them stale in the pages it did not rewrite when a chapter is added, renamed or moved.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
REPO = DOCS.parent
BUILD = REPO / "_build"
SOURCE = BUILD / "site-src"
HTML = BUILD / "html"
PAGES = ("index.md", "grading.md")
LINKED = {**{name: DOCS / name for name in PAGES},
          "README.md": REPO / "README.md", "notebooks": REPO / "notebooks", "exercises": REPO / "exercises"}

sys.path.insert(0, str(DOCS))
import mathjax  # noqa: E402  (docs/ is not a package: the path above finds it)


def stage() -> None:
    """The source folder: a relative link per entry of LINKED, and nothing else."""
    SOURCE.mkdir(parents=True, exist_ok=True)
    for entry in SOURCE.iterdir():
        if entry.name not in LINKED and entry.is_symlink():  # a page since removed from docs/
            entry.unlink()
    for name, target in LINKED.items():
        link = SOURCE / name
        relative = os.path.relpath(target, SOURCE)
        if link.is_symlink() and os.readlink(link) == relative:
            continue
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(relative, target_is_directory=target.is_dir())


def main(argv: list[str]) -> int:
    from sphinx.cmd.build import build_main

    mathjax.install(BUILD / "mathjax")
    stage()
    return build_main(["-b", "html", "-a", "-q", "-W", "--keep-going", "-c", str(DOCS), "-d", str(BUILD / "doctrees"),
                       *argv, str(SOURCE), str(HTML)])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
