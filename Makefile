# The README's commands. Each target sets up what it needs in .venv first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: quickstart test lint bench proto clean

$(BIN)/twg: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(BIN)/twg

quickstart: $(BIN)/twg
	$(BIN)/twg quickstart

test: $(BIN)/twg
	$(BIN)/pytest -q

lint: $(BIN)/twg
	$(BIN)/ruff check server client tests load-tests flight-tickets deploy
	$(BIN)/ruff format --check server client tests load-tests flight-tickets deploy
	$(BIN)/mypy

bench: $(BIN)/twg
	$(BIN)/python load-tests/ingest_bench.py

# Recompile the ticket contract after editing proto/ (a test checks it is current).
proto: $(BIN)/twg
	$(BIN)/python -m grpc_tools.protoc -Iproto \
		--descriptor_set_out=client/thalweg_client/wire/ticket_v1.desc \
		proto/thalweg/flight/v1/ticket.proto

clean:
	rm -rf $(VENV) twg-quickstart .pytest_cache .mypy_cache .ruff_cache
