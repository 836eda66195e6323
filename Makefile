# dlrfeed — the two commands a newcomer needs are `make run` and `make test`.
# Every target installs what it is missing first (virtualenv, packages, PostgreSQL server).

PYTHON  ?= python3
VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed-stamp
PROTO   := protos/gateway/receipts/v1/feed.proto
DURATION ?= 0

.DEFAULT_GOAL := help
.PHONY: help install system-packages proto lint test run bench bench-growth bench-floor chaos fuzz clean

help:
	@echo "make run     local demo: PostgreSQL + fake gateway + traffic + dlrfeed, live view (DURATION=s to stop by itself)"
	@echo "make test    lint + the whole test suite against real PostgreSQL and real gRPC"
	@echo "make bench   benchmarks; writes docs/benchmarks.md and docs/benchmarks-webhook.md"
	@echo "make bench-growth  a store grown to RECEIPTS (20 M) receptions; writes docs/benchmarks-growth.md"
	@echo "make bench-floor   the disk floors (public columns; what the rules require) beside dlrfeed's store (JSON)"
	@echo "make chaos   the full fault-injection matrix; writes docs/reliability.md"
	@echo "make fuzz    long property-based fuzzing of parse + ingest"
	@echo "make lint    ruff + mypy --strict"
	@echo "make proto   regenerate the gRPC stubs from $(PROTO)"
	@echo "make clean   remove the virtualenv and local run data"

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@# The tools (benchmarks, chaos, the demo, throwaway clusters) run from the checkout and
	@# are never in the wheel: the venv finds them through a .pth file.
	@echo "$(CURDIR)/tools" \
	  > "$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/dlrfeed-checkout.pth"
	@touch $(STAMP)

install: $(STAMP) system-packages

system-packages:
	@bash scripts/ensure-system-packages.sh

proto: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m grpc_tools.protoc -Iprotos \
	  --python_out=src --grpc_python_out=src --mypy_out=src --mypy_grpc_out=src $(PROTO)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tools scripts tests
	$(VENV)/bin/ruff format --check src tools scripts tests
	$(VENV)/bin/mypy

test: install lint
	$(PY) -m pytest

run: install
	$(PY) scripts/demo.py --duration $(DURATION)

bench: install
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	$(PY) scripts/bench.py --out docs/benchmarks.md
	$(PY) scripts/bench_webhook.py --out docs/benchmarks-webhook.md > /dev/null

# Hours at the default size; RECEIPTS=1000000 STEP=200000 for a smaller run. The profiles run
# side by side, each on its own CPU; GROWTH_CONFIGS=default=8000000,recommended grows one of
# them less (each 20 M run needs ~36 GB of disk, more with the recommended 16 GB of WAL). The
# receipts go through fakegw to a dlrfeed run daemon; GROWTH_DRIVER=store hands them to a Store.
RECEIPTS ?= 20000000
STEP ?= 1000000
GROWTH_CONFIGS ?= default,recommended
GROWTH_DRIVER ?= daemon
bench-growth: install
	$(PY) scripts/bench_growth.py --receipts $(RECEIPTS) --step $(STEP) \
		--configs $(GROWTH_CONFIGS) --driver $(GROWTH_DRIVER) --pinned \
		--out docs/benchmarks-growth.md --json docs/benchmarks-growth.json

# A store grown to FLOOR_RECEPTIONS as bench-growth grows it (through fakegw and the daemon),
# and two copies of its rows: only the public schema's columns and keys, and those with what
# the processing rules also require; bytes per reception of each (minutes at 1 M).
FLOOR_RECEPTIONS ?= 1000000
bench-floor: install
	$(PY) scripts/bench_floor.py --receptions $(FLOOR_RECEPTIONS)

chaos: install
	$(PY) scripts/chaos.py --full --out docs/reliability.md

fuzz: install
	HYPOTHESIS_PROFILE=fuzz $(PY) -m pytest tests -m fuzz --timeout=0 --durations=0 -q \
	  --hypothesis-show-statistics

clean:
	rm -rf $(VENV) .run
