# kwinspect: two commands for a newcomer (`make demo`, `make test`), the rest for us.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
DEMO_CAPTURE ?= captures/confluent-mock-produce-consume.pcap

.PHONY: demo test lint sysdeps bench fuzz schema captures clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

# Tools the end-to-end tests need from the system (tcpdump to capture real traffic).
sysdeps:
	@command -v tcpdump >/dev/null 2>&1 || { \
	  echo "installing tcpdump (needed by the end-to-end tests)"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq tcpdump >/dev/null; }

demo: $(STAMP)
	$(VENV)/bin/kwinspect summary $(DEMO_CAPTURE)

lint: $(STAMP)
	$(VENV)/bin/ruff check kwinspect tests bench
	$(VENV)/bin/lint-imports

test: $(STAMP) sysdeps lint
	$(PY) -m pytest -q -n 2 --dist loadgroup

schema: $(STAMP)
	$(PY) -m kwinspect.protocol.schema.build

captures: $(STAMP) sysdeps
	$(PY) -m kwinspect.testing.make_captures

bench: $(STAMP)
	$(PY) bench/run.py

fuzz: $(STAMP)
	$(PY) bench/fuzz.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
