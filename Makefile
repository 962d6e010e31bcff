# Entry points. Every target builds the pinned CPU stack into .venv first (idempotent, ~3 min cold).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: stack test lint ab bench soak clean

stack:
	bash scripts/build-stack.sh

test: stack
	$(PY) -m ruff check ascend_graph_patch tests conftest.py
	$(PY) -m pytest -q

lint: stack
	$(PY) -m ruff check ascend_graph_patch tests conftest.py

ab: stack
	ASCEND_GRAPH_PATCH_SIM=1 $(VENV)/bin/ascend-graph-patch ab --out ab-report

bench: stack
	ASCEND_GRAPH_PATCH_SIM=1 $(VENV)/bin/ascend-graph-patch bench

soak: stack
	ASCEND_GRAPH_PATCH_SIM=1 $(PY) -m ascend_graph_patch.ab.soak

clean:
	rm -rf $(VENV) build *.egg-info ab-report
