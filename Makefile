# The two commands a new machine needs: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo chat-demo test bench lint clean docs docs-serve docs-check docs-images docs-outputs

# A current pip first: the one a venv starts with (23.2 with Python 3.11) took 59 s, 54 of them
# CPU, to resolve the dev extras (it checks every wheel of every release against the platform's
# tags); pip 26 resolves the same 171 packages in 21 s.
$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=26"

# Stamps re-run the install only when the package metadata changes. --no-compile: byte-compiling
# every installed file (ray and transformers are large) took half the install; modules compile
# when first imported instead.
# lmforge's CPU decode kernels are compiled here, once per source and torch version (into
# ~/.cache/lmforge/kernels, or LMFORGE_KERNEL_CACHE); without this, the first decode does it.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --no-compile -e .
	$(BIN)/python -m lmforge.kernels.cpu_decode
	touch $@

# openai-whisper is installed without its dependencies only for the file it ships with GPT-2's
# BPE ranks (whisper/assets/gpt2.tiktoken): the tokenizer's compatibility tests need them offline.
$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --no-compile -e ".[dev]"
	$(BIN)/python -m pip install --quiet --no-compile --no-deps openai-whisper==20250625
	$(BIN)/python -m lmforge.kernels.cpu_decode
	touch $@ $(VENV)/.installed

$(VENV)/.installed-bench: pyproject.toml $(VENV)/.installed-dev
	$(BIN)/python -m pip install --quiet -e ".[dev,bench]"
	touch $@

demo: $(VENV)/.installed
	$(BIN)/lmforge speedrun $(ARGS)

# The speedrun (reused when runs/auto already holds it), then SFT and GRPO on arithmetic.
chat-demo: $(VENV)/.installed
	$(BIN)/lmforge speedrun --chat $(ARGS)

# The web chat page's test drives Debian's Chromium; playwright never downloads a browser.
$(VENV)/.chromium: | $(BIN)/python
	test -x /usr/bin/chromium || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium > /dev/null; }
	touch $@

# Generated code (HumanEval) runs under bubblewrap where Linux allows it (lmforge/eval/sandbox.py);
# the escape tests need it. Elsewhere lmforge warns once and runs it behind its guard alone.
$(VENV)/.bubblewrap: | $(BIN)/python
	test "$$(uname -s)" != Linux || command -v bwrap > /dev/null || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap > /dev/null; }
	touch $@

# lint-imports checks the layer contracts in pyproject.toml ([tool.importlinter]) first. The
# suite runs on TEST_WORKERS processes (pytest-xdist): many tests wait on subprocesses, sockets
# and process groups, so two workers finish in about 0.7x the time of one, even on 2 cores.
# Bytecode is written whatever PYTHONDONTWRITEBYTECODE says: the install skips byte-compiling
# (above), and without .pyc files every Python process the suite starts (workers, CLI runs,
# torchrun ranks, Inductor's compile workers) compiles torch's sources again: 2 to 4 s of CPU
# each, over a quarter of the suite's CPU time.
TEST_WORKERS ?= 2
test: $(VENV)/.installed-dev $(VENV)/.chromium $(VENV)/.bubblewrap
	$(BIN)/lint-imports --no-cache
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -n $(TEST_WORKERS) $(PYTEST_ARGS)

# The documentation site (docs/, mkdocs.yml). `docs` regenerates the pages made from the code
# and the results files (docs/gen/generate.py), then builds site/ with --strict (a broken link
# or reference fails); `docs-serve` serves it on 127.0.0.1:8001 (8000 is lmforge serve's).
# `docs-check` runs every shell and Python block of the tutorials and concept pages at its
# smallest scale (tests/docs/runner.py); `make test` runs the quick ones. `docs-images` retakes
# the screenshots in docs/images/ from a small speedrun; `docs-outputs` reruns the pages that show
# what their commands print (all, or PAGES=...) as written and records it for the site.
docs: $(VENV)/.installed-dev
	$(BIN)/python docs/gen/generate.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: $(VENV)/.installed-dev
	$(BIN)/python docs/gen/generate.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --dev-addr 127.0.0.1:8001

docs-check: $(VENV)/.installed-dev $(VENV)/.chromium
	LMFORGE_DOCS_CHECK=1 $(BIN)/python -m pytest tests/docs -p no:xdist $(PYTEST_ARGS)

docs-outputs: $(VENV)/.installed-dev
	$(BIN)/python docs/gen/capture.py $(PAGES)
	$(BIN)/python docs/gen/generate.py

docs-images: $(VENV)/.installed-dev $(VENV)/.chromium
	$(BIN)/python docs/gen/screenshots.py $(ARGS)

bench: $(VENV)/.installed-bench
	for script in benchmarks/*.py; do $(BIN)/python $$script || exit 1; done

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check lmforge tests docs/gen
	$(BIN)/ruff format --check lmforge tests docs/gen

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache site
