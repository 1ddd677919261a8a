# make test: set up .venv, then run ruff, mypy and the test suite on every supported
#   (Python, Django) pair with nox (see noxfile.py).
# make test-fast: ruff, mypy and the test suite in .venv only (Python 3.11, Django 5.2).
# make demo: set up .venv and run the example project (web server, worker, Redis).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: test test-fast demo lint system-packages

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,django52,hiredis]'
	touch $@

# redis-server runs the tests' private Redis; Debian's chromium runs the browser tests
# (Playwright cannot download its own browser here). As root, install what is missing.
system-packages:
	@missing=""; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	[ -x /usr/bin/chromium ] || missing="$$missing chromium"; \
	if [ -n "$$missing" ] && [ "$$(id -u)" = 0 ]; then \
	  apt-get update -qq && apt-get install -y -qq $$missing; \
	elif [ -n "$$missing" ]; then \
	  echo "Missing:$$missing. Install with: sudo apt-get install$$missing"; \
	  command -v redis-server >/dev/null; \
	fi

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

test: $(VENV)/.installed system-packages
	$(BIN)/nox

test-fast: $(VENV)/.installed system-packages lint
	$(BIN)/pytest --numprocesses=auto

demo: $(VENV)/.installed
	$(BIN)/python example_project/demo.py
