"""Opening a course notebook in `make lab` changes nothing in it.

JupyterLab writes the kernel it started into the notebook's metadata; when the
stored kernelspec differs from the kernel `make lab` registers, a notebook that
was only opened shows as modified and asks to be saved.
"""
import json
import re

import pytest

import notebook_factory as nf

NOTEBOOKS = sorted([*(nf.REPO / "notebooks").glob("*.ipynb"), *(nf.REPO / "solutions").glob("*.ipynb"),
                    *(nf.REPO / "exercises").glob("*.ipynb")])


def registered_kernel():
    """{name, display_name} from the Makefile's `ipykernel install` line."""
    makefile = (nf.REPO / "Makefile").read_text()
    found = re.search(r'ipykernel install .*--name (\S+) --display-name "([^"]+)"', makefile)
    assert found, "the Makefile registers the course's kernel"
    return {"name": found.group(1), "display_name": found.group(2), "language": "python"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_the_stored_kernelspec_is_the_one_make_lab_registers(path):
    assert json.loads(path.read_text())["metadata"]["kernelspec"] == registered_kernel()
