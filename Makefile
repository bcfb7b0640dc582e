# The README's two commands: `make run` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
HOST ?= 127.0.0.1
PORT ?= 8700

.PHONY: install run test bench clean

# The editable install's import finder maps the top-level packages that exist at install
# time: a package added later (by a pull or a merge) is invisible to `.venv/bin/orchestrator`
# until the next install. So the install also depends on the list of top-level packages,
# kept in a file that is rewritten (made newer than the stamp) only when the list changes.
PACKAGES := $(sort $(patsubst %/__init__.py,%,$(wildcard */__init__.py)))
PACKAGE_LIST := $(VENV)/.top-level-packages
$(shell mkdir -p $(VENV) && (echo '$(PACKAGES)' | cmp -s - $(PACKAGE_LIST) || echo '$(PACKAGES)' > $(PACKAGE_LIST)))

$(STAMP): pyproject.toml $(PACKAGE_LIST)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
	@# From outside the checkout, as `.venv/bin/orchestrator` imports them: no cwd on sys.path.
	cd / && $(abspath $(BIN))/python -c 'import orchestrator.cli, mounts.layout, sandbox_agent'
	@touch $(STAMP)

install: $(STAMP)

# The data dir's location is checked first (standard library only, no venv needed): a clone
# under /tmp is refused in a second with what to set, not after the install.
run:
	@$(PYTHON) -m orchestrator.preflight "$${ORCH_DATA_DIR:-./data}"
	@$(MAKE) --no-print-directory install
	ORCH_DATA_DIR=$${ORCH_DATA_DIR:-./data} $(BIN)/orchestrator serve --host $(HOST) --port $(PORT)

test: install
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) .pytest_cache
