"""What the website adds to a notebook's page at build time, so that the notebooks stay as they are.

- A "run this chapter" box under each lecture's and exercise set's title: clone, `make lab`, the
  notebook's path (a set's own first cells say how to grade it).
- Under a widget's stored figure, a note that the figure is interactive in JupyterLab.  The course's
  widgets store their figure as a PNG beside a one-line text/plain that says so (FigureBox in
  course_lib/views/widgets.py); the site shows the PNG, so the note carries that line's meaning.
"""
from __future__ import annotations

import re

from docutils import nodes

# FigureBox's text/plain: "<roofline explorer: run this cell in JupyterLab to move its controls; ...>"
WIDGET_TEXT = re.compile(r"<(?P<what>[^:<>]+): run this cell in JupyterLab to move its controls;\s+[^<>]*>")
PLACEHOLDER = "https://github.com/OWNER/REPO"  # as the README's Binder link writes an address not yet known


def run_box(docname: str, repository: str) -> nodes.admonition | None:
    """The box for ``docname`` (``notebooks/NN_x`` or ``exercises/NN_x``); None for the other pages."""
    folder, _, stem = docname.partition("/")
    if folder not in ("notebooks", "exercises") or not stem:
        return None
    url = repository or PLACEHOLDER
    clone = url.rstrip("/").removesuffix(".git").rsplit("/", 1)[-1].rsplit(":", 1)[-1]
    path = f"{docname}.ipynb"
    commands = [f"git clone {url}", f"cd {clone}", "make lab"]
    box = nodes.admonition(classes=["tip", "run-this-chapter"])
    box += nodes.title(text="Run this chapter" if folder == "notebooks" else "Work on this exercise set")
    block = nodes.literal_block(text="\n".join(commands), language="bash")
    box += block
    said = nodes.paragraph()
    said += nodes.Text("You need Python >= 3.10 and make; the first ")
    said += nodes.literal(text="make lab")
    said += nodes.Text(" installs the pinned packages. It opens chapter 00: open ")
    said += nodes.literal(text=path)
    said += nodes.Text(" from JupyterLab's file browser." if folder == "notebooks" else
                       " from JupyterLab's file browser, write your answers in its answer cells and run the "
                       "check cell under each.")
    if not repository:
        said += nodes.Text(" (Replace the address with the course repository's.)")
    box += said
    return box


def widget_note(bundle: nodes.container) -> nodes.admonition | None:
    """The note for a mime bundle that holds a widget's stored figure, else None."""
    kinds = {child.get("mime_type"): child for child in bundle.children}
    if "image/png" not in kinds or "text/plain" not in kinds:
        return None
    match = WIDGET_TEXT.fullmatch(kinds["text/plain"].astext().strip())
    if match is None:
        return None
    what = re.sub(r"^(the|an?) ", "", match["what"].strip())
    note = nodes.admonition(classes=["note", "widget-note"])
    note += nodes.title(text="Interactive in JupyterLab")
    para = nodes.paragraph()
    para += nodes.Text(f"The figure above is the {what} as it was drawn for the values this cell was run with. "
                       "Run the cell in JupyterLab (")
    para += nodes.literal(text="make lab")
    para += nodes.Text(") to move its controls.")
    note += para
    return note


def add_to_page(app, doctree: nodes.document) -> None:
    docname = app.env.docname
    box = run_box(docname, app.config.course_repository)
    section = next(iter(doctree.findall(nodes.section)), None)
    if box is not None and section is not None:
        section.insert(1 if section.children and isinstance(section[0], nodes.title) else 0, box)
    for bundle in list(doctree.findall(lambda n: isinstance(n, nodes.container) and n.get("nb_element") == "mime_bundle")):
        note = widget_note(bundle)
        if note is not None:
            bundle.parent.insert(bundle.parent.index(bundle) + 1, note)


def setup(app):
    app.add_config_value("course_repository", "", "env")
    app.add_config_value("course_site_digest", "", "env")
    app.connect("doctree-read", add_to_page)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
