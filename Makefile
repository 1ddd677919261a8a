# make test: set up .venv, then run ruff and the test suite on every supported
#   (Python, Django) pair with nox (see noxfile.py).
# make test-fast: ruff and the test suite in .venv only (Python 3.11, Django 5.2).
# make demo: set up .venv and run the example project (web server, worker, Redis).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: test test-fast demo lint redis-server-installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,django52,hiredis]'
	touch $@

redis-server-installed:
	@command -v redis-server >/dev/null || { \
	  echo "redis-server is needed: sudo apt-get install redis-server (macOS: brew install redis)"; \
	  exit 1; }

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: $(VENV)/.installed redis-server-installed
	$(BIN)/nox

test-fast: $(VENV)/.installed redis-server-installed lint
	$(BIN)/pytest

demo: $(VENV)/.installed
	$(BIN)/python example_project/demo.py
