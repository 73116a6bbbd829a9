# Two commands: `make serve` and `make test`. Both create .venv when it is missing.
# Contributors' fast lane: `make check`, the same install as `make test` without the OS
# packages, runs the tests not marked slow (no browser, nginx, Ray, soak or end-to-end bench).
# Both type-check server/ and engine/ first (`make typecheck`), and fail where mypy does.
PYTHON ?= python3
VENV   ?= .venv
# HOST and PORT are passed to `voxwire serve` only when given (make serve PORT=9000), so
# that otherwise the settings file and VOXWIRE_* variables decide (flags outrank both).
HOST   ?=
PORT   ?=
ARGS   ?=
PYTEST_ARGS ?=

BIN   := $(VENV)/bin
# Two install stamps: the server and its runtime dependencies (what `make serve` needs), and
# on top of them what only the tests and benchmarks need (test, bench, Ray and Kokoro extras,
# the CosyVoice2 and Kokoro references), so that `make serve` on a fresh machine installs no
# test package.
SERVE_STAMP := $(VENV)/.voxwire-serve-installed
TEST_STAMP  := $(VENV)/.voxwire-test-installed
SERVE_FLAGS := $(if $(HOST),--host $(HOST)) $(if $(PORT),--port $(PORT))

.PHONY: serve test check typecheck install system-packages clean

# What the tests need from the OS, from Debian's packages (never a downloaded browser):
# Chromium and Node for the JS client's tests, nginx for tests/deploy, the flac tool for
# the check of what readers make of a streamed FLAC (docs/protocol.md), podman with runc
# and mmdebstrap to build and run deploy/Dockerfile's image (tests/deploy/test_container.py).
# Installed only when missing, so a machine that has them is left alone.
system-packages:
	@missing=""; \
	command -v make >/dev/null || missing="$$missing make"; \
	$(PYTHON) -c 'import venv, ensurepip' 2>/dev/null || missing="$$missing python3-venv"; \
	[ -x /usr/bin/chromium ] || missing="$$missing chromium"; \
	command -v node >/dev/null || missing="$$missing nodejs"; \
	command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing="$$missing nginx"; \
	command -v flac >/dev/null || missing="$$missing flac"; \
	command -v podman >/dev/null || missing="$$missing podman"; \
	command -v runc >/dev/null || [ -x /usr/sbin/runc ] || missing="$$missing runc"; \
	command -v mmdebstrap >/dev/null || missing="$$missing mmdebstrap"; \
	if [ -n "$$missing" ]; then \
	  echo "make test: installing$$missing from the OS packages"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

ORACLE := tests/engine/cosyvoice2/oracle-requirements.txt
KOKORO_ORACLE := tests/engine/kokoro/oracle-requirements.txt

# Reinstall whenever a dependency list changes, so `make serve` and `make test` also update .venv.
# Editable: the .pth line setuptools writes is the checkout's root, where voxwire/ links to
# server/, engine/ and benchmarks/ (pyproject.toml), so a new module needs no reinstall.
$(SERVE_STAMP): $(BIN)/python pyproject.toml clients/python/pyproject.toml
	$(BIN)/python -m pip install --quiet -e clients/python -e .
	touch $@

# The CosyVoice2 reference (a test oracle only) goes in without its dependencies: it pins
# torch, numpy and transformers versions that the project must not take. So do Kokoro's
# (kokoro, kokoro-onnx), whose dependencies would bring misaki[en] with spaCy.
# The client's framework extras go in the same pip run as the server's: one resolution
# picks versions that suit both (Pipecat wants protobuf < 7; Ray's grpcio-reflection's
# newest wants 7, an older one does not).
$(TEST_STAMP): $(SERVE_STAMP) $(ORACLE) $(KOKORO_ORACLE)
	$(BIN)/python -m pip install --quiet -e '.[test,bench,ray,kokoro]' -e 'clients/python[decode,pipecat,livekit]'
	$(BIN)/python -m pip install --quiet --no-deps -r $(ORACLE) -r $(KOKORO_ORACLE)
	touch $@

install: $(SERVE_STAMP)

serve: $(SERVE_STAMP)
	$(BIN)/voxwire serve $(SERVE_FLAGS) $(ARGS)

# mypy on server/ and engine/, as pyproject.toml's [tool.mypy] names them (voxwire.server,
# voxwire.engine: the checkout's voxwire/ links to the folders).
typecheck: $(TEST_STAMP)
	$(BIN)/python -m mypy

test: system-packages typecheck
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# No system-packages: what is marked slow (pyproject.toml) is what needs Chromium or nginx.
check: typecheck
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache
