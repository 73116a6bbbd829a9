# Two commands: `make serve` and `make test`. Both create .venv when it is missing.
PYTHON ?= python3
VENV   ?= .venv
HOST   ?= 127.0.0.1
PORT   ?= 8000
ARGS   ?=
PYTEST_ARGS ?=

BIN   := $(VENV)/bin
STAMP := $(VENV)/.voxwire-installed

.PHONY: serve test install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Reinstall whenever a dependency list changes, so `make test` also updates .venv.
$(STAMP): $(BIN)/python pyproject.toml clients/python/pyproject.toml
	$(BIN)/python -m pip install --quiet -e clients/python -e '.[test]'
	touch $@

install: $(STAMP)

serve: $(STAMP)
	$(BIN)/voxwire serve --host $(HOST) --port $(PORT) $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
