# make test: the loop, about 8 minutes on 2 cores from a fresh clone: set up .venv, then
#   ruff, the import layers, mypy and the test suite in .venv (Python 3.11, Django 5.2 +
#   backport), one process per core, but for the browser, failover and long tests, and
#   with the model-based tests at a third of their examples.
# make check: everything CI runs: make test, the documentation site, then with nox the
#   rest on every supported (Python, Django) pair (see noxfile.py). About 20 minutes.
# make demo: set up .venv-demo (the package and the newest Django, nothing of the dev
#   toolchain, and OpenTelemetry's SDK) and run the example project (web server,
#   worker, scheduler, Redis), which prints the traces of its requests and jobs.
# make docs: set up .venv-docs (Sphinx and the package, nothing else: no apt-get, no
#   MariaDB headers, no Redis) and build the documentation site into docs/_build/html,
#   warnings as errors.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: test check demo docs lint test-packages system-packages

# uv installs in seconds what pip takes most of a minute for. mysqlclient (the outbox's
# tests on MariaDB) builds against the system's MariaDB client headers.
$(VENV)/.installed: pyproject.toml | test-packages
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip uv
	$(BIN)/uv pip install --quiet --python $(BIN)/python -e '.[dev,django52,hiredis]'
	touch $@

# redis-server runs the tests' private Redis; libmariadb-dev builds mysqlclient; Debian's
# chromium runs the browser tests (make check; Playwright cannot download its own
# browser here). As root, install what is missing.
test-packages:
	@$(MAKE) --no-print-directory system-packages BROWSER=no

BROWSER ?= yes
system-packages:
	@missing=""; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	pkg-config --exists libmariadb 2>/dev/null || missing="$$missing libmariadb-dev pkg-config"; \
	[ "$(BROWSER)" = no ] || [ -x /usr/bin/chromium ] || missing="$$missing chromium"; \
	if [ -n "$$missing" ] && [ "$$(id -u)" = 0 ]; then \
	  apt-get update -qq && apt-get install -y -qq $$missing; \
	elif [ -n "$$missing" ]; then \
	  echo "Missing:$$missing. Install with: sudo apt-get install$$missing"; \
	  command -v redis-server >/dev/null && pkg-config --exists libmariadb; \
	fi

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

# The model-based tests at a third of their examples; make check runs them whole, in
# nox's session of the oldest pair, instead.
MODELS ?= REDISQUEUE_MODEL_EXAMPLES=100 REDISQUEUE_PERIODIC_EXAMPLES=80
test: $(VENV)/.installed lint
	$(MODELS) $(BIN)/pytest --numprocesses=auto -m "not failover and not long" \
	  --ignore=tests/test_browser.py $(LEFT_TO_NOX)

check: system-packages
	$(MAKE) --no-print-directory test LEFT_TO_NOX="--ignore=tests/test_protocol_model.py \
	  --ignore=tests/test_periodic_model.py"
	$(MAKE) --no-print-directory docs
	$(BIN)/nox

# The docs' own venv: Sphinx, and the package for autodoc to import (Django 5.2 and the
# backport, which run on every Python the package supports).
DOCS_VENV := .venv-docs

$(DOCS_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/pip install --quiet --upgrade pip uv
	$(DOCS_VENV)/bin/uv pip install --quiet --python $(DOCS_VENV)/bin/python -e '.[docs,django52]'
	touch $@

# Sphinx, from a clean build: -W warnings are errors (--keep-going lists them all), -n
# every reference must resolve. Seconds.
docs: $(DOCS_VENV)/.installed
	rm -rf docs/_build
	$(DOCS_VENV)/bin/sphinx-build -W --keep-going -n -q -b html docs docs/_build/html
	@echo "docs: open docs/_build/html/index.html"

# The demo's own venv: the package (with cron and hiredis) and the newest Django, which
# needs Python 3.12 or newer: pyenv's newest 3.13 or 3.12 (installed, whatever `pyenv
# global` says), else python3.13 or python3.12 on the PATH. Without one, Django 5.2 and
# the backport on $(PYTHON), and a message that says so.
DEMO_VENV := .venv-demo
# The demo prints the traces of each request and its jobs (docs/howto/tracing.md).
DEMO_TRACING := opentelemetry-sdk opentelemetry-instrumentation-django
PYENV_ROOT ?= $(HOME)/.pyenv

$(DEMO_VENV)/.installed: pyproject.toml
	@python=""; \
	for version in 3.13 3.12; do \
	  pyenv=$$(ls -d $(PYENV_ROOT)/versions/$$version.*/bin/python 2>/dev/null | sort -V | tail -n 1); \
	  for candidate in $$pyenv python$$version; do \
	    if $$candidate -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then \
	      python=$$candidate; break 2; \
	    fi; \
	  done; \
	done; \
	if [ -n "$$python" ]; then \
	  django="django>=6.0"; extras="cron,hiredis,otel"; \
	else \
	  python=$(PYTHON); django="django>=5.2,<6"; extras="cron,hiredis,otel,django52"; \
	  echo "demo: no Python 3.12 or newer found (pyenv's 3.13 or 3.12, python3.13, python3.12)"; \
	  echo "demo: Django 6 needs one; running on $$($$python --version) with Django 5.2 and the backport"; \
	fi; \
	echo "demo: setting up $(DEMO_VENV) with $$($$python --version) and $$django"; \
	rm -rf $(DEMO_VENV) && \
	$$python -m venv $(DEMO_VENV) && \
	$(DEMO_VENV)/bin/pip install --quiet uv && \
	$(DEMO_VENV)/bin/uv pip install --quiet --python $(DEMO_VENV)/bin/python -e ".[$$extras]" "$$django" \
	  $(DEMO_TRACING)
	touch $@

demo: $(DEMO_VENV)/.installed
	$(DEMO_VENV)/bin/python -m django --version
	$(DEMO_VENV)/bin/python example_project/demo.py
