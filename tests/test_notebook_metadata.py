"""Opening a course notebook in `make lab` changes nothing in it.

JupyterLab writes the kernel it started into the notebook's metadata; when the
stored kernelspec differs from the kernel `make lab` registers, a notebook that
was only opened shows as modified and asks to be saved.
"""
import json
import re

import pytest

from conftest import REPO

NOTEBOOKS = sorted([*(REPO / "notebooks").glob("*.ipynb"), *(REPO / "solutions").glob("*.ipynb"),
                    *(REPO / "exercises").glob("*.ipynb")])


def registered_kernel():
    """{name, display_name} from the Makefile's `ipykernel install` line."""
    makefile = (REPO / "Makefile").read_text()
    found = re.search(r'ipykernel install .*--name (\S+) --display-name "([^"]+)"', makefile)
    assert found, "the Makefile registers the course's kernel"
    return {"name": found.group(1), "display_name": found.group(2), "language": "python"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_the_stored_kernelspec_is_the_one_make_lab_registers(path):
    assert json.loads(path.read_text())["metadata"]["kernelspec"] == registered_kernel()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_no_stored_output_is_an_unrenderable_widget_reference(path):
    """No widget state is stored, so a stored widget reference shows "Error displaying widget: model not
    found" in JupyterLab (and its repr text on GitHub): the course's widgets store their figure instead."""
    nb = json.loads(path.read_text())
    views = [cell["id"] for cell in nb["cells"] for out in cell.get("outputs", [])
             if "application/vnd.jupyter.widget-view+json" in out.get("data", {})]
    assert views == []


def test_widget_output_keeps_its_figure_not_its_reference():
    from nbformat.v4 import new_code_cell, new_notebook, new_output

    from course_lib.grading.authoring import WIDGET_VIEW, strip_widget_views

    twin = new_output("display_data", data={WIDGET_VIEW: {"model_id": "m"}, "image/png": "iVBOR", "text/plain": "<fig>"})
    bare = new_output("display_data", data={WIDGET_VIEW: {"model_id": "n"}, "text/plain": "IntSlider(3)"})
    nb = new_notebook(cells=[new_code_cell("x", id="a", outputs=[twin, bare])])
    strip_widget_views(nb)
    assert set(nb.cells[0].outputs[0].data) == {"image/png", "text/plain"}
    assert WIDGET_VIEW in nb.cells[0].outputs[1].data  # a widget without a figure is left as it was


# What the developers read and the learner does not have: their guide's files and their issue tracker.
NOT_THE_LEARNERS = re.compile(r"\b(?:shared/|GPU\.md|DESIGN\.md|STYLE\.md)|\bissue \d+\b")  # "issues 12 loads" is the verb


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_no_notebook_names_a_developer_file_or_issue(path):
    nb = json.loads(path.read_text())
    texts = [(cell["id"], "".join(cell["source"])) for cell in nb["cells"]]
    texts += [(cell["id"], json.dumps(out)) for cell in nb["cells"] for out in cell.get("outputs", [])]
    found = [(cell_id, m.group(0)) for cell_id, text in texts for m in NOT_THE_LEARNERS.finditer(text)]
    assert found == []


def test_make_lab_prints_an_address_that_lands_on_chapter_00():
    """`make lab LAB_ARGS=--no-browser` prints the server's default_url; without it the address is /lab,
    the Launcher, and a newcomer never sees chapter 00."""
    recipe = (REPO / "Makefile").read_text().split("\nlab:", 1)[1].split("\n\n", 1)[0]
    found = re.search(r"--LabApp\.default_url=/lab/tree/(\S+)", recipe)
    assert found, "make lab must set --LabApp.default_url"
    assert found.group(1) == "notebooks/00_start_here.ipynb" and (REPO / found.group(1)).exists()
