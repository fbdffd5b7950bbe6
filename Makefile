# perfkit — two commands on a fresh machine: `make demo` and `make test`.
# Both create .venv when it is missing (a fast no-op when it is up to date).
#
# torch: the CPU build `torch==2.13.0` is installed unless the venv already has a torch.
# On a GPU node keep your CUDA/ROCm torch by creating the venv yourself first:
#     python3 -m venv --system-site-packages .venv   # sees the system's CUDA/ROCm torch
# or pick another build:  make TORCH_SPEC="torch==2.13.0" TORCH_INDEX="--index-url <wheel index>"

PYTHON      ?= python3
VENV        ?= .venv
PY          := $(VENV)/bin/python
TORCH_SPEC  ?= torch==2.13.0
TORCH_INDEX ?=
STAMP       := $(VENV)/.perfkit-installed
EXTRAS      := dev,slurm,hf,tfrecord,webdataset,ray
DEMO_DIR    ?= runs/quickstart
DEMO_WORKERS ?= 1

.PHONY: venv demo test test-fast docs browser hta triton clean help

help:
	@echo "make demo   create .venv, run the quickstart on this machine's device, write $(DEMO_DIR)/report.html"
	@echo "make test   create .venv and run the whole test suite, notebooks included (nbval)"
	@echo "make docs   write the reference pages from the code and build the site into build/site"
	@echo "make clean  remove .venv and runs/"

venv: $(STAMP)

# pip byte-compiles what it installs one file at a time: 21 s of torch's 27 s install and 44 s of
# the rest's 104 s here, most of it for modules nothing here imports (transformers' hundreds of
# model families, Ray's dashboard, MLflow's server). It installs without compiling (uv, which installs
# all but torch, does not compile either), and each module
# is compiled the first time it is imported: the venv is this project's own, so the commands below
# write bytecode caches into it (and into the checkout's __pycache__, ignored by git) even where the
# environment sets PYTHONDONTWRITEBYTECODE (this project's CI machines), where every process would
# otherwise compile every module it imports, every time (the suite took 21 min instead of 12).
# Compiling all of site-packages up front instead took 45 s on 2 cores, before any test ran.
unexport PYTHONDONTWRITEBYTECODE
PIP_INSTALL := $(PY) -m pip install -q --disable-pip-version-check --no-compile

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@if $(PY) -c "import torch" 2>/dev/null; then \
	  echo "keeping the venv's torch $$($(PY) -c 'import torch; print(torch.__version__)')"; \
	else \
	  echo "installing $(TORCH_SPEC)"; $(PIP_INSTALL) "$(TORCH_SPEC)" $(TORCH_INDEX); \
	fi
	@# The rest with uv (~20 s instead of pip's ~100 s), from the sources pip is configured with
	@# (.ci/pip_sources.py); pip does it where uv cannot be installed or fails, and in a venv that
	@# sees the system's packages (a GPU node's torch): uv does not count those as installed and
	@# would put a torch from the index in front of the node's.
	@if ! grep -qiE '^include-system-site-packages *= *true' $(VENV)/pyvenv.cfg && $(PIP_INSTALL) uv && \
	    $(VENV)/bin/uv pip install -q --python $(PY) --index-strategy unsafe-best-match \
	    $$($(PY) .ci/pip_sources.py) -e '.[$(EXTRAS)]'; then echo "installed perfkit[$(EXTRAS)] with uv"; \
	else echo "installing perfkit[$(EXTRAS)] with pip (the venv sees the system's packages, or uv could not)"; \
	  $(PIP_INSTALL) -e '.[$(EXTRAS)]'; fi
	@# jsonschema's format-nongpl extra (asked for by nbformat and jupyter-events) brings rfc3987-syntax,
	@# which builds ~35 Earley parsers at import: 1.2 s of CPU in every process that imports nbformat
	@# (papermill, perfkit run/sweep, every Slurm task, Jupyter) for the 'iri' format, which no notebook
	@# schema uses (python-jsonschema/jsonschema#1428). Without it jsonschema skips that one format.
	@$(PY) -m pip uninstall -y -q rfc3987-syntax >/dev/null 2>&1 || true
	@# ipykernel writes the spec into a new /tmp/tmp*_kernels folder and leaves it (empty) behind.
	@tmp=$$(mktemp -d) && TMPDIR=$$tmp $(PY) -m ipykernel install --sys-prefix --name perfkit \
	  --display-name "perfkit ($(VENV))" >/dev/null && rm -rf "$$tmp"
	@touch $(STAMP)

# The quickstart sweep (templates/quickstart.yaml) on this machine's device, then its report.
# Re-running resumes: finished configurations are not run again.
demo: venv
	$(VENV)/bin/perfkit sweep templates/quickstart.yaml --out $(DEMO_DIR) --workers $(DEMO_WORKERS)
	$(VENV)/bin/perfkit report $(DEMO_DIR) -o $(DEMO_DIR)/report.html
	@echo "demo: open $(DEMO_DIR)/report.html (executed notebooks in $(DEMO_DIR)/notebooks, rows in $(DEMO_DIR)/results)"

# The unit/integration tests and the notebooks (nbval, small default parameters) in one run.
# Rows that notebooks record when run by nbval go to a temp dir, not into the tree.
# Much of the suite waits on kernels, torchrun ranks and Slurm, so it runs on TEST_WORKERS
# pytest-xdist workers; --dist loadscope keeps each notebook's cells (and each test file) on one
# worker, in order, and --no-loadscope-reorder hands the files out in the order the suite puts
# them (the longest first: tests/conftest.py LONGEST_MODULES) instead of by their number of tests.
TEST_WORKERS ?= 4
# perfkit's own modules byte-compiled first, on every core (a second run only checks timestamps),
# rather than by the first of the workers' processes that import each.
COMPILE_OWN = $(PY) -m compileall -q -j 0 perfkit tests >/dev/null
# The rows go to a folder of their own, removed after a green run (kept and named after a red one).
test: venv browser hta triton
	@$(COMPILE_OWN)
	out=$$(mktemp -d -t perfkit-test-rows.XXXXXX); \
	PERFKIT_OUT=$$out PERFKIT_STATIC=1 $(PY) -m pytest tests notebooks --ignore=tests/notebooks \
	  --nbval-lax --nbval-current-env -p no:cacheprovider --durations=20 -n $(TEST_WORKERS) --dist loadscope \
	  --no-loadscope-reorder; \
	rc=$$?; if [ $$rc = 0 ]; then rm -rf "$$out"; else echo "make test: the notebooks' rows are kept in $$out"; fi; exit $$rc

# The inner loop: no kernels, no ranks, no Slurm, no browser (those are marked slow), in ~2 minutes.
# Its tests compute rather than wait, so one worker a core: on 2 cores, 102-130 s with 2 workers
# against 129-137 s with 4 (each worker also collects the whole suite, ~6 s of CPU).
FAST_WORKERS ?= $(shell nproc 2>/dev/null || echo 2)
test-fast: venv hta
	@$(COMPILE_OWN)
	$(PY) -m pytest tests -m "not slow" -p no:cacheprovider -n $(FAST_WORKERS) --durations=10

# Headless Chromium for the report's real-browser test (Debian's package; root only).
browser:
	@if ! command -v chromium >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing chromium for the report's browser test"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null) \
	  || echo "chromium could not be installed: the browser test will skip with the reason"; \
	fi

# Triton (perfkit[triton]) for the kernels' Triton example and its tests, interpreted on a CPU: `make
# test` installs it, `make demo` does not. Into a folder of its own, .triton/, not the venv: the tests
# that run Triton put it on their subprocesses' PYTHONPATH with TRITON_INTERPRET=1, which Triton reads
# when it is first imported, and torch imports it by itself during a training step (a pytest worker
# that ran one before could not interpret: "Cannot call @triton.jit'd outside of the scope of a
# kernel"). The rest of the suite runs as a CPU user without Triton has it.
TRITON_DIR ?= .triton
triton: venv
	@if [ ! -f $(TRITON_DIR)/.perfkit-installed ]; then echo "installing triton==3.9.0 into $(TRITON_DIR)/ (the kernels' Triton example)"; \
	  rm -rf $(TRITON_DIR); \
	  if [ -x $(VENV)/bin/uv ]; then $(VENV)/bin/uv pip install -q --python $(PY) --target $(TRITON_DIR) --no-deps \
	    --index-strategy unsafe-best-match $$($(PY) .ci/pip_sources.py) "triton==3.9.0"; \
	  else $(PIP_INSTALL) --target $(TRITON_DIR) --no-deps "triton==3.9.0"; fi \
	  && touch $(TRITON_DIR)/.perfkit-installed \
	  || echo "triton could not be installed: the Triton tests skip and say why"; fi

# HTA's critical-path analysis is the reference the step graph's critical path is held to
# (tests/test_step_graph.py). It needs pandas < 3 (under pandas 3 it raises in DataFrame.drop), so
# it runs from a small venv of its own: HolisticTraceAnalysis without its notebook dependencies
# (jupyterlab, pytest) and what its analysis imports, ~5 s with uv. If it cannot be built, that one
# test skips and says why. benchmarks/trace_analysis_speed.py runs perfkit's trace reader in it too
# (beside HTA, one interpreter), hence msgspec and isal.
HTA_VENV := .venv-hta
HTA_DEPS := "pandas<3" numpy networkx plotly pydot psutil pyyaml msgspec isal
hta: $(HTA_VENV)/.ok
$(HTA_VENV)/.ok: Makefile | $(STAMP)  # HTA_DEPS are listed here
	@rm -rf $(HTA_VENV) && $(PYTHON) -m venv $(HTA_VENV) && \
	if [ -x $(VENV)/bin/uv ]; then install="$(VENV)/bin/uv pip install -q --python $(HTA_VENV)/bin/python $$($(PY) .ci/pip_sources.py)"; \
	else install="$(HTA_VENV)/bin/python -m pip install -q --disable-pip-version-check"; fi; \
	($$install --no-deps "HolisticTraceAnalysis==0.5.0" && $$install $(HTA_DEPS) && touch $@ \
	 && echo "built $(HTA_VENV): HTA's critical path, the step graph's reference") \
	|| echo "$(HTA_VENV) could not be built: the HTA critical-path comparison will skip and say why"

docs: venv
	$(PY) docs/gen_reference.py
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet
	@echo "docs: build/site/index.html"

clean:
	rm -rf $(VENV) $(HTA_VENV) $(TRITON_DIR) runs perfkit-runs
