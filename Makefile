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

ORACLE := tests/engine/cosyvoice2/oracle-requirements.txt

# Reinstall whenever a dependency list changes, so `make test` also updates .venv.
# The CosyVoice2 reference (a test oracle only) goes in without its dependencies: it pins
# torch, numpy and transformers versions that the project must not take.
$(STAMP): $(BIN)/python pyproject.toml clients/python/pyproject.toml $(ORACLE)
	$(BIN)/python -m pip install --quiet -e clients/python -e '.[test,bench]'
	$(BIN)/python -m pip install --quiet --no-deps -r $(ORACLE)
	touch $@

install: $(STAMP)

serve: $(STAMP)
	$(BIN)/voxwire serve --host $(HOST) --port $(PORT) $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
