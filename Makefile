# Two entry points for a fresh machine: `make demo` and `make test`. Everything else is for developers.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test bench lint venv clean host-tools

venv: $(STAMP)

# The worker scripts run on this host in the demo and the tests: they need bash, curl, jq and coreutils.
# As root (CI, a fresh container) missing ones are installed from Debian; otherwise we say what to install.
HOST_TOOLS := git curl jq
host-tools:
	@missing=""; for t in $(HOST_TOOLS); do command -v $$t >/dev/null || missing="$$missing $$t"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing:$$missing"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  else echo "missing host tools:$$missing (sudo apt-get install$$missing)" >&2; exit 1; fi; \
	fi

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: host-tools $(STAMP)
	$(VENV)/bin/fleet demo

test: host-tools $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) -m bench

lint: $(STAMP)
	$(VENV)/bin/ruff check reconciler infra tests bench
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/actionlint .github/workflows/*.yml

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
