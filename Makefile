# The README's commands. Each target sets up what it needs in .venv first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: quickstart test unit coverage lint bench soak proto mutate clean

# The client is its own distribution (client/, ADR 0019). The server depends on it by
# path, which installs a copy; the second step makes that copy an editable install so
# the tests see client edits (pip refuses both in one command: it reads them as two
# different thalweg-client requirements).
$(BIN)/twg: pyproject.toml client/pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	$(BIN)/pip install --quiet --no-deps -e ./client
	touch $(BIN)/twg

quickstart: $(BIN)/twg
	$(BIN)/twg quickstart

test: $(BIN)/twg
	$(BIN)/pytest -q

# The everyday loop: the unit tests only (no brokers; under a minute on two cores).
unit: $(BIN)/twg
	$(BIN)/pytest -q tests/unit

# The unit tests under coverage: fails below pyproject's floor, or when a commit lowered
# the floor (.ci/coverage_floor.py). About a minute.
coverage: $(BIN)/twg
	$(BIN)/python .ci/coverage_floor.py
	$(BIN)/coverage run -m pytest -q -p no:randomly tests/unit
	$(BIN)/coverage report --format=total

lint: $(BIN)/twg
	$(BIN)/ruff check server client tests load-tests flight-tickets deploy examples
	$(BIN)/ruff format --check server client tests load-tests flight-tickets deploy examples
	$(BIN)/mypy

bench: $(BIN)/twg
	$(BIN)/python load-tests/ingest_bench.py

# The fault tests (tests/e2e) SOAK_RUNS times each with fresh seeds, round by round; not
# in CI (hours on two cores). Failures are kept with their seeds under build/soak;
# SOAK_ARGS="--budget-min 90 --only crash" bounds or narrows it. SIGINT or SIGTERM ends
# it with a summary of the runs done; the summary names the commit, so soaks of one
# version add up across sittings.
SOAK_RUNS ?= 20
soak: $(BIN)/twg
	$(BIN)/python tests/soak.py --runs $(SOAK_RUNS) $(SOAK_ARGS)

# Mutation testing (ADR 0017): run before resolving an issue, not in CI. Mutates a snapshot
# of server/thalweg in build/mutation (never the working tree) for the modules listed in
# pyproject's [tool.mutmut], runs the tests that cover each mutant, and prints killed /
# survived counts with the survivors per module. Inspect one: cd build/mutation &&
# ../../.venv/bin/mutmut show <name>. MUTATE_ONLY="src/thalweg/x.py ..." narrows or
# widens the modules (paths as under build/mutation); MUTATE_JOBS sets the workers.
MUTATION := build/mutation
$(BIN)/mutmut: $(BIN)/twg
	$(BIN)/pip install --quiet -e '.[dev,mutation]'
	$(BIN)/pip install --quiet --no-deps -e ./client

mutate: $(BIN)/mutmut
	rm -rf $(MUTATION) && mkdir -p $(MUTATION)/src
	cp -r server/thalweg $(MUTATION)/src/thalweg
	cp -r tests pyproject.toml $(MUTATION)/
	if [ -n "$(MUTATE_ONLY)" ]; then $(BIN)/python -c 'import re, sys; p = sys.argv[1]; \
		s = open(p).read(); only = ", ".join(repr(m) for m in sys.argv[2:]); \
		open(p, "w").write(re.sub(r"only_mutate = \[[^]]*\]", "only_mutate = [" + only + "]", s))' \
		$(MUTATION)/pyproject.toml $(MUTATE_ONLY); fi
	cd $(MUTATION) && $(CURDIR)/$(BIN)/mutmut run --max-children $${MUTATE_JOBS:-2} >run.log 2>&1 \
		|| { tail -c 3000 run.log; exit 1; }
	cd $(MUTATION) && $(CURDIR)/$(BIN)/mutmut export-cicd-stats >/dev/null \
		&& cat mutants/mutmut-cicd-stats.json
	cd $(MUTATION) && $(CURDIR)/$(BIN)/mutmut results >survivors.txt; \
		echo "survived or untested, per module:"; \
		awk -F'.x' '{print $$1}' survivors.txt | sed 's/^ *//' | sort | uniq -c

# Recompile the ticket contract and the Flight SQL subset after editing proto/ (tests check
# both are current).
proto: $(BIN)/twg
	$(BIN)/python -m grpc_tools.protoc -Iproto \
		--descriptor_set_out=client/thalweg_client/wire/ticket_v1.desc \
		proto/thalweg/flight/v1/ticket.proto
	$(BIN)/python -m grpc_tools.protoc -Iproto \
		--descriptor_set_out=server/thalweg/flight/sql/flight_sql.desc \
		proto/arrow/flight/protocol/sql/thalweg_subset.proto

clean:
	rm -rf $(VENV) twg-quickstart .pytest_cache .mypy_cache .ruff_cache $(MUTATION)
