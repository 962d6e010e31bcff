# Entry points. Every target builds the pinned CPU stack into .venv first (idempotent, ~3 min cold).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: stack test lint ab bench soak mutate clean

stack:
	bash scripts/build-stack.sh

test: stack
	$(PY) -m ruff check ascend_graph_patch simulator tests conftest.py
	$(PY) -m ruff format --check ascend_graph_patch simulator tests conftest.py
	$(PY) -m pytest -q

lint: stack
	$(PY) -m ruff check ascend_graph_patch simulator tests conftest.py
	$(PY) -m ruff format --check ascend_graph_patch simulator tests conftest.py

ab: stack
	$(VENV)/bin/ascend-graph-patch ab --out ab-report

bench: stack
	$(VENV)/bin/ascend-graph-patch bench

soak: stack
	$(VENV)/bin/ascend-graph-patch soak

# Mutation testing of the line's relaunch arguments (not part of `make test`): MUTATE_ARGS=--quick
# for the short run; the table lands in mutation-report/ (docs/design.md, "Mutation testing").
mutate: stack
	$(PY) scripts/mutate.py $(MUTATE_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info simulator/build simulator/*.egg-info ab-report soak-result.json mutation-report
