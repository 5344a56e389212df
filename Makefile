# Every target is self-sufficient on a fresh machine: it builds .venv on first use.
PY      := .venv/bin/python
# The interpreter .venv is built from: the system's python3 (SYSTEM_PYTHON) where it has the same
# minor version (3.x) as the python3 on PATH and can make a venv (Debian's needs python3-venv),
# else that python3. Why: Debian's and Ubuntu's /usr/bin/python3 is built with profile feedback
# and link-time optimisation and linked statically; the pyenv build on this project's machines has
# neither and loads libpython as a shared library, and the suite is mostly processes importing
# torch and transformers (bench/startup.py, docs/suite_time.md). A python3 of another minor version on
# PATH is a choice this leaves alone; VENV_PYTHON=... overrides both. (Not PYTHON: the scripts
# read that as the interpreter they run.) An existing .venv is kept: `make clean` to switch.
SYSTEM_PYTHON ?= /usr/bin/python3
VENV_PYTHON ?= $(shell sys='$(SYSTEM_PYTHON)'; v='import sys; print(sys.version_info[:2])'; \
             if [ -x "$$sys" ] && "$$sys" -c 'import ensurepip, venv' >/dev/null 2>&1 && \
                [ "$$("$$sys" -c "$$v")" = "$$(python3 -c "$$v" 2>/dev/null)" ]; then echo "$$sys"; \
             else echo python3; fi)
# TORCH: one requirement (it is quoted below), e.g. TORCH=torch==2.9.1
TORCH   ?= torch==2.13.0
# uv installs the pinned requirements (wheels unpacked and compiled to bytecode in parallel), and
# torch too where PIP_FIND_LINKS names the folders of a site's own torch build (as on this
# project's machines): uv reads none of pip's settings, so those folders are passed on to it, and
# elsewhere pip installs torch, reading pip.conf as before (uv given no folder would take PyPI's
# CUDA build). INSTALLER=pip, on a new .venv, for a site whose package index is configured for
# pip only (pip.conf, PIP_INDEX_URL).
INSTALLER ?= uv
UV_PIN  := uv==0.13.9
UV      := .venv/bin/uv pip install -q --python $(PY)
UV_FIND_LINKS := $(foreach l,$(PIP_FIND_LINKS),--find-links $(l))
ifneq ($(INSTALLER),$(filter uv pip,$(firstword $(INSTALLER))))
$(error INSTALLER=$(INSTALLER): expected uv or pip)
endif
# The stamp names the install's settings: `make install TORCH=...` on an installed .venv installs
# again, and so does switching back (the install removes the other settings' stamps).
STAMP   := .venv/.installed-$(shell printf '%s' '$(TORCH) $(INSTALLER)' | cksum | cut -d' ' -f1)

.PHONY: install install-gpu bytecode test check-breaks demo ablation bench-gpu clean

$(STAMP): requirements.txt requirements-plugin-test.txt pyproject.toml
	test -x $(PY) || "$(VENV_PYTHON)" -m venv .venv
ifeq ($(INSTALLER),uv)
	$(PY) -m pip install -q $(UV_PIN)
	# torch first and pinned: a looser pin pulls gigabytes of CUDA wheels.
ifneq ($(strip $(PIP_FIND_LINKS)),)
	$(UV) --compile-bytecode $(UV_FIND_LINKS) "$(TORCH)"
else
	$(PY) -m pip install -q "$(TORCH)"
endif
	# Then torch is named again beside the requirements: installed, it holds, and a requirement
	# wanting another fails here instead of pulling a CUDA build.
	$(UV) --compile-bytecode -r requirements.txt "$(TORCH)"
	# lmms-eval's interface only, for the plugin test (its full dependency set conflicts with ours).
	$(UV) --compile-bytecode --no-deps -r requirements-plugin-test.txt
	$(UV) --no-deps -e .
else
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -r requirements.txt "$(TORCH)"
	$(PY) -m pip install -q --no-deps -r requirements-plugin-test.txt
	$(PY) -m pip install -q --no-deps -e .
endif
	rm -f .venv/.installed*
	touch $(STAMP)

install: $(STAMP)

# The package's bytecode, written once before a run: where PYTHONDONTWRITEBYTECODE is set (as on
# this project's machines) every launched process would otherwise compile the sources it imports
# again. compileall skips what is current; Python checks each file's stamp, so a stale one costs
# a recompile in memory, never a wrong import.
bytecode: $(STAMP)
	$(PY) -m compileall -q llava_norm llava_norm_demo

# On a CUDA machine: liger-kernel, then flash-attn built against the installed torch
# (docs/cluster.md). MAX_JOBS bounds the build's parallel compilers (each takes several GB).
MAX_JOBS ?= 4

install-gpu: $(STAMP)
	$(PY) -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "install-gpu: torch sees no CUDA GPU here")'
	$(PY) -m pip install -q -r requirements-gpu.txt
	MAX_JOBS=$(MAX_JOBS) $(PY) -m pip install --no-build-isolation -r requirements-flash-attn.txt

# pytest-xdist, one test module per worker at a time (its module-scoped runs built once), the
# longest modules first (tests/conftest.py; --no-loadscope-reorder keeps that order). Three
# workers on two cores: the launch-bound modules wait on process start-up, kills and
# collectives, and the others fill those waits; a fourth adds more contention for the cores
# than it fills (docs/suite_time.md).
TEST_JOBS ?= 3

test: bytecode
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder tests

# Each named break of tests/breaks.py applied in turn: the test that names it must fail.
check-breaks: bytecode
	$(PY) tests/breaks.py

demo: bytecode
	$(PY) -m llava_norm.cli demo

# Every tiny arm x 3 seeds and the table with intervals (README, "Is it more than seed noise?").
ablation: bytecode
	$(PY) -m llava_norm.cli ablation

# On a GPU machine: every GPU figure (bench/gpu_kit.py) with the machine's own torch.
bench-gpu:  # PART=1 or PART=2 for one half (each under 8 minutes on one H100)
	PART=$(PART) bash bench/gpu_kit.sh $(ARGS)

clean:
	rm -rf .venv runs
