# kwinspect: two commands for a newcomer (`make demo`, `make test`), the rest for us.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# Two installs, two stamps: `make demo` needs only kwinspect itself (a few MB);
# `make test` and the rest need the dev set (Spark, brokers, clients: ~1.2 GB).
# The dev set includes the demo's, so either order works, on a fresh clone too.
DEMO_STAMP := $(VENV)/.demo-stamp
STAMP      := $(VENV)/.dev-stamp
DEMO_CAPTURE ?= captures/confluent-mock-produce-consume.pcap

.PHONY: demo test lint sysdeps bench fuzz fuzz-asan schema captures clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# setup.py and the C sources: a changed extension is compiled again by the next install
C_SOURCES := setup.py $(wildcard kwinspect/_c*.c kwinspect/_c*.h kwinspect/*/_c*.c kwinspect/*/_c*.h)

$(DEMO_STAMP): pyproject.toml $(C_SOURCES) | $(PY)
	$(PY) -m pip install -q -e .
	touch $(DEMO_STAMP)

$(STAMP): pyproject.toml $(C_SOURCES) | $(PY)
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP) $(DEMO_STAMP)

# Tools the end-to-end tests need from the system (Debian packages):
#   tcpdump            required: captures the real traffic on lo
#   iproute2, ethtool  the 1500-MTU network-namespace variant (skipped without them)
#   tshark             the independent oracle in tests/e2e (skipped without it)
#   jq                 required: the docs' shell examples pipe into it (tests/docs)
#   tmux               required: the TUI test in a real terminal (tests/tui/test_real_terminal.py)
#   java (a JRE 17+)   required: Spark, for the pipeline tests and the standalone cluster
#                      (tests/spark; Debian's default-jre-headless is OpenJDK 17 on bookworm)
# Only what is missing is installed; the optional ones may fail without failing the build.
SYSDEPS_REQUIRED := tcpdump:tcpdump jq:jq tmux:tmux java:default-jre-headless
SYSDEPS_OPTIONAL := ip:iproute2 ethtool:ethtool tshark:tshark
sysdeps:
	@if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	have() { command -v "$$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$$1" ] || [ -x "/sbin/$$1" ]; }; \
	req=; opt=; \
	for t in $(SYSDEPS_REQUIRED); do have "$${t%%:*}" || req="$$req $${t#*:}"; done; \
	for t in $(SYSDEPS_OPTIONAL); do have "$${t%%:*}" || opt="$$opt $${t#*:}"; done; \
	if [ -n "$$req$$opt" ]; then \
	  echo "installing for the tests:$$req$$opt"; \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get update -qq || true; \
	fi; \
	if [ -n "$$req" ]; then \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$req >/dev/null || exit 1; \
	fi; \
	for p in $$opt; do \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$p >/dev/null 2>&1 || \
	    echo "note: could not install $$p; the tests that need it will be skipped"; \
	done

demo: $(DEMO_STAMP)
	$(VENV)/bin/kwinspect summary $(DEMO_CAPTURE)

lint: $(STAMP)
	$(VENV)/bin/ruff check kwinspect tests bench rig codegen
	$(VENV)/bin/lint-imports

# One pytest worker per core, 2 to 4: the Spark and broker tests hold ~1 GB each, and two
# workers are needed for the serial groups to overlap the rest. --durations names the
# slowest tests in every log, so the next trim starts from numbers.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -lt 2 ] && n=2; [ $$n -gt 4 ] && n=4; echo $$n)
test: $(STAMP) sysdeps lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=25

schema: $(STAMP)
	$(PY) -m codegen.schema

captures: $(STAMP) sysdeps
	$(PY) -m rig.make_captures

bench: $(STAMP)
	$(PY) bench/run.py

fuzz: $(STAMP)
	$(PY) bench/fuzz.py

# The fuzz targets that reach the C extensions (pcap, dissect, core, decode: the dissector
# targets reach the compiled conversation too), the compiled labels' tests (odd Python
# objects no decoded body holds) and the compiled conversation's (mixed, mangled
# conversations, every case it leaves to Python), with them
# built under AddressSanitizer, preloaded (the interpreter itself is not instrumented;
# PYTHONMALLOC=malloc puts every Python buffer under ASan's eye). A report does not stop
# the run (-fsanitize-recover, halt_on_error=0): each goes to build/asan/report.*, and
# any report fails the target. The ordinary build is put back afterwards, always.
# FUZZ_ASAN_ARGS: anything bench/fuzz.py takes.
FUZZ_ASAN_ARGS ?= --inputs 20000 --targets pcap,dissect,core,decode
fuzz-asan: $(STAMP)
	rm -rf build/asan && mkdir -p build/asan
	CFLAGS="-fsanitize=address -fsanitize-recover=address -fno-omit-frame-pointer -g -O1" \
	  LDFLAGS="-fsanitize=address" $(PY) setup.py -q build_ext --inplace --force --build-temp build/asan
	status=0; PYTHONMALLOC=malloc LD_PRELOAD="$$($${CC:-gcc} -print-file-name=libasan.so)" \
	  ASAN_OPTIONS=detect_leaks=0:halt_on_error=0:log_path=build/asan/report \
	  $(PY) bench/fuzz.py $(FUZZ_ASAN_ARGS) || status=$$?; \
	PYTHONMALLOC=malloc LD_PRELOAD="$$($${CC:-gcc} -print-file-name=libasan.so)" \
	  ASAN_OPTIONS=detect_leaks=0:halt_on_error=0:log_path=build/asan/report \
	  $(PY) -m pytest -q -p no:cacheprovider tests/stream/test_labels_compiled.py \
	  tests/stream/test_conversation_compiled.py tests/analyze/test_record_rows_compiled.py \
	  tests/export/test_crender.py tests/test_chunk_loop.py tests/protocol/test_crc32c_compiled.py \
	  tests/stream/test_latency_round.py tests/protocol/test_decode_fast.py tests/protocol/test_scan.py \
	  tests/capture/test_stream_numbers.py \
	  "tests/test_parallel.py::test_compiled_reader_sends_plain_packets_as_runs_of_records" \
	  "tests/test_parallel.py::test_reader_runs_of_plain_packets_give_one_process_output" || status=$$?; \
	$(PY) setup.py -q build_ext --inplace --force; \
	if ls build/asan/report.* >/dev/null 2>&1; then \
	  cat build/asan/report.*; echo "fuzz-asan: AddressSanitizer reports above"; exit 1; fi; \
	echo "fuzz-asan: no AddressSanitizer report"; exit $$status

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache kwinspect/_c*.so kwinspect/*/_c*.so
