# The two commands: `make lab` and `make test`, and a third, `make site`. Each builds what it needs
# from nothing on a machine with Python >= 3.10 and make, and is quick the second time.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
NBVAL  := --nbval --nbval-current-env --nbval-sanitize-with tests/sanitize.cfg
SITE_VENV  := .venv-site
SITE_STAMP := $(SITE_VENV)/.installed
NEED_PYTHON := $(PYTHON) -c 'import sys; sys.exit("Python >= 3.10 is needed, found " + sys.version.split()[0]) if sys.version_info < (3, 10) else None'

.PHONY: lab test lint exercises notebooks venv site clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@$(NEED_PYTHON)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[test]"
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (FlashAttention course)" >/dev/null
	touch $(STAMP)

# JupyterLab refuses to run as root unless told to (containers, Binder-like boxes).
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)

# The server runs with .venv/bin first on PATH, so a notebook's `!python ...` and a JupyterLab
# terminal find the course's Python (`python -m course_lib.grade` works in both).  A terminal is
# bash reading .venv/bin/activate, not a login shell, which would reset PATH from /etc/profile.
BASH := $(shell command -v bash)
ifneq ($(BASH),)
TERMINAL := --ServerApp.terminado_settings='{"shell_command": ["$(BASH)", "--rcfile", "$(CURDIR)/$(BIN)/activate", "-i"]}'
endif

# default_url is the address the server prints and the browser opens: chapter 00, not the Launcher
# (a notebook given as an argument is opened by the browser alone; `--no-browser` printed /lab).
lab: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/jupyter lab $(ALLOW_ROOT) --ServerApp.root_dir="$(CURDIR)" $(TERMINAL) $(LAB_ARGS) \
		--LabApp.default_url=/lab/tree/notebooks/00_start_here.ipynb

test: $(STAMP) $(SITE_STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadfile tests notebooks solutions $(NBVAL) $(PYTEST_ARGS)

# The habits pyproject.toml's [tool.ruff] sets down: pyflakes, pycodestyle, bugbear, sorted imports,
# no blind except without a reason, no # noqa that silences nothing.
lint: $(STAMP)
	$(BIN)/ruff check .

# Regenerate the student copies in exercises/ from solutions/.
exercises: $(STAMP)
	$(BIN)/python -m course_lib.authoring

# Re-execute every lecture and solution notebook in place (outputs are committed).
notebooks: $(STAMP)
	$(BIN)/python -m course_lib.authoring --execute notebooks/*.ipynb solutions/*.ipynb
	$(BIN)/python -m course_lib.authoring

# The website, into _build/html: the notebooks as committed (nothing is executed), MathJax served from
# the site, nothing loaded from the network (docs/build.py; CONTRIBUTING.md says how it is published).
# Its venv holds only pyproject.toml's `site` group (Sphinx, myst-nb), not the course's numba and
# torch; `make test` builds it too, because tests/test_site.py builds the site.
$(SITE_STAMP): pyproject.toml
	@$(NEED_PYTHON)
	test -x $(SITE_VENV)/bin/python || $(PYTHON) -m venv $(SITE_VENV)
	$(SITE_VENV)/bin/python -m pip install -q --upgrade pip
	$(SITE_VENV)/bin/python -m pip install -q --group site
	touch $(SITE_STAMP)

site: $(SITE_STAMP)
	$(SITE_VENV)/bin/python docs/build.py

clean:
	rm -rf $(VENV) $(SITE_VENV) _build
