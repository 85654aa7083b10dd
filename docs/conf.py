"""Sphinx's settings for the course's website (`make site`, see docs/build.py).

Every setting below that is not a plain choice was found by looking at the built pages: without it
a page loads something from the network or shows raw source.
"""
import hashlib
import os
import subprocess
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS))

project = "FlashAttention from the ground up"
author = "the course's authors"
copyright = "the course's authors, MIT licence"  # no year: the site is rebuilt from any commit

extensions = ["myst_nb", "course_site"]
# Sphinx rereads every page when a setting changes, not when an extension's code does: this one's
# digest is a setting, so a changed course_site.py is seen by the incremental build.
course_site_digest = hashlib.sha256((DOCS / "course_site.py").read_bytes()).hexdigest()
root_doc = "index"
exclude_patterns = ["README.md", "**/.ipynb_checkpoints"]  # README.md is quoted by the pages, not a page

# The notebooks are shown as committed: the stored outputs are what the tests hold the prose to,
# and executing them would take half an hour.
nb_execution_mode = "off"
# Markdown printed by a cell (the tables of chapters 09 and 10) goes through the same parser as the
# prose; with the default it shows as raw `| ... |` lines.
nb_render_markdown_format = "myst"
# myst-nb would load the ipywidgets renderer from a CDN; no widget state is stored, so it could only
# fail: a widget's stored output is its figure (course_site adds the note saying so).
nb_ipywidgets_js = {}

myst_enable_extensions = ["dollarmath", "amsmath"]
# Chapter 02 writes `$$ ... $$` inside a paragraph and inside list items; without this it stays raw.
myst_dmath_double_inline = True
myst_heading_anchors = 3

# MathJax from the site's own static files (docs/mathjax.py), never from a CDN.
mathjax_path = "mathjax/tex-mml-chtml.js"
html_static_path = ["_static", str(DOCS.parent / "_build" / "mathjax")]
html_css_files = ["course.css"]
html_copy_source = False  # else every notebook is copied into the site a second time
html_show_sourcelink = False
html_title = project
html_last_updated_fmt = None


def repository_url():
    """Where `git clone` fetches the course: SITE_REPO_URL (the Pages workflow sets it), else this
    checkout's origin, else "" (the run boxes then show a placeholder and say to replace it)."""
    url = os.environ.get("SITE_REPO_URL", "")
    if not url:
        try:
            url = subprocess.run(["git", "-C", str(DOCS), "remote", "get-url", "origin"], capture_output=True,
                                 text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            url = ""
    return url if url.startswith(("https://", "git@")) else ""


course_repository = repository_url()

html_theme = "sphinx_book_theme"
html_theme_options = {
    "home_page_in_toc": False,  # the title above the chapters is the link home
    "navbar_persistent": [],  # pydata's default puts a second search box in an otherwise empty top bar
    "show_toc_level": 2,
    "use_download_button": False,  # its .ipynb would need html_copy_source; the run box names the file
    "use_fullscreen_button": False,
    "navigation_with_keys": False,
    "footer_content_items": ["copyright.html"],  # the author would be said twice ("By ...", "(c) ...")
}
if course_repository.startswith("https://"):
    html_theme_options |= {"repository_url": course_repository, "use_repository_button": True}
