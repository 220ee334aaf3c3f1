# triage: the two commands of the README are `make demo` and `make test`.
# Both install what they need first (a venv with pip, Kafka's jars with Maven),
# and both run against a real local Apache Kafka broker (see `triage kafka`).

SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.triage-installed
KAFKA_PORT ?= 9092

NATIVE := $(VENV)/.triage-compiled
COMPILED_DIRS := triage/admission triage/sim triage/topics triage/streams
CORE_SOURCES := $(shell grep -o '"triage/[a-z]*/[a-z_]*\.py"' setup.py | tr -d '"') setup.py

.PHONY: help install compile test demo lint broker-up broker-down clean distclean

help: ## List the targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip "setuptools>=77"  # PEP 639 license fields (pyproject.toml)
	$(BIN)/python -m pip install -q -e ".[dev]"
	@touch $(STAMP)

$(NATIVE): $(STAMP) $(CORE_SOURCES)
	@rm -rf build $(addsuffix /*.so,$(COMPILED_DIRS)) $(addsuffix /*.so.stale,$(COMPILED_DIRS))
	@echo "compiling the admission core, the simulator, the reason codes and the record builders with mypyc (pure Python runs if this fails) ..."
	@TRIAGE_COMPILE=1 $(BIN)/python setup.py -q build_ext --inplace >$(VENV)/mypyc.log 2>&1 \
	  && touch $(addsuffix /*.so,$(COMPILED_DIRS)) $@ \
	  || echo "mypyc build failed (see $(VENV)/mypyc.log): running pure Python"

compile: $(NATIVE) ## Compile the admission core and simulator with mypyc (again after editing them).

HELM_VERSION := v3.22.0
HELM := $(BIN)/helm

$(HELM):
	@command -v go >/dev/null || { echo "go is needed to build helm (the chart's test renders with it)"; exit 2; }
	@echo "building helm $(HELM_VERSION) from the Go module proxy (once) ..."
	@GOBIN=$(abspath $(BIN)) go install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)

install: $(STAMP) $(NATIVE) $(HELM) ## Create .venv, install deps, compile the core, fetch Kafka's jars, build helm.
	@$(BIN)/triage kafka install

broker-up: install ## Start the local Kafka broker on KAFKA_PORT (default 9092); idempotent.
	@$(BIN)/triage kafka up --port $(KAFKA_PORT)

broker-down: ## Stop the local Kafka broker that triage started.
	@if [ -x $(BIN)/triage ]; then $(BIN)/triage kafka down --port $(KAFKA_PORT); fi

test: broker-up ## Run the tests (real broker), ruff and mypy; fails if any of them fails.
	@rc=0; \
	TRIAGE_TEST_BOOTSTRAP=$${TRIAGE_TEST_BOOTSTRAP:-127.0.0.1:$(KAFKA_PORT)} $(BIN)/pytest -q || rc=1; \
	$(BIN)/ruff check . || rc=1; \
	$(BIN)/mypy || rc=1; \
	exit $$rc

demo: install ## Bring up the broker and topics and run the demo.
	$(BIN)/triage demo

lint: install ## ruff and mypy only.
	$(BIN)/ruff check .
	$(BIN)/mypy

clean: ## Remove caches, local run output and the compiled core (keeps .venv, Kafka's data).
	rm -rf .pytest_cache .mypy_cache .ruff_cache .hypothesis build dist var reports demo-out
	rm -f $(addsuffix /*.so,$(COMPILED_DIRS)) $(addsuffix /*.so.stale,$(COMPILED_DIRS)) $(NATIVE)
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -print0 | xargs -0 rm -rf

distclean: broker-down clean ## Also remove .venv (Kafka's jars and data stay in ~/.cache/triage).
	rm -rf $(VENV)
