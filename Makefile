# The two commands: `make lab` and `make test`. Both build .venv from nothing
# on a machine with Python >= 3.10 and make, and are quick the second time.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
NBVAL  := --nbval --nbval-current-env --nbval-sanitize-with tests/sanitize.cfg

.PHONY: lab test lint exercises notebooks venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit("Python >= 3.10 is needed, found " + sys.version.split()[0]) if sys.version_info < (3, 10) else None'
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

lab: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/jupyter lab $(ALLOW_ROOT) --ServerApp.root_dir="$(CURDIR)" $(TERMINAL) $(LAB_ARGS) notebooks/00_start_here.ipynb

test: $(STAMP)
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

clean:
	rm -rf $(VENV)
