# The README's two commands: `make run` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
HOST ?= 127.0.0.1
PORT ?= 8700

.PHONY: install run test bench clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
	@touch $(STAMP)

install: $(STAMP)

run: install
	ORCH_DATA_DIR=$${ORCH_DATA_DIR:-./data} $(BIN)/orchestrator serve --host $(HOST) --port $(PORT)

test: install
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) .pytest_cache
