# tlog: the two quick-start commands are `make demo` and `make test`.
SHELL   := bash
.SHELLFLAGS := -o pipefail -c
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# pip finds the on-disk torch CPU wheel here when the machine has it.
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)
# PYTHONWARNINGS=ignore: setuptools' build backend warns about an editable install
# beside folders named like its packages; the design card lays the repository out so.
PIP     := PYTHONWARNINGS=ignore $(BIN)/pip install --disable-pip-version-check -q $(FIND_LINKS) -c constraints.txt
# Drop pip's notes about index folders a machine-wide pip config names but this
# machine lacks ("Location ... is ignored"); every other line, and the exit code, stay.
QUIET   := 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }

SPARK_STAMP := $(VENV)/.installed-spark

.PHONY: setup setup-spark demo test bench lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(PIP) --upgrade pip setuptools wheel $(QUIET)
	$(PIP) -e '.[dev,torch,serve,gpu,frameworks]' $(QUIET)
	touch $(STAMP)

# pyspark (the lake's Spark engine, tlog[spark]) for the tests and benchmarks only:
# make demo does not need it.
setup-spark: $(SPARK_STAMP)

$(SPARK_STAMP): $(STAMP)
	$(PIP) -e '.[dev,torch,serve,gpu,frameworks,spark]' $(QUIET)
	touch $(SPARK_STAMP)

demo: setup
	$(BIN)/tlog demo

# pytest-xdist workers: one per core plus one, at most 4. Many tests wait (on a
# torchrun, a browser, a subprocess, a pipeline's queues), and the extra worker fills
# those gaps (docs/TESTING.md has the timings). --dist loadfile keeps each test file on
# one worker, so a file's module fixtures run once. -rs prints why tests skipped.
JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n + 1 > 4 ? 4 : n + 1 )))
TEST_ARGS ?= -n $(JOBS) --dist loadfile
# Tests whose truth needs the machine's cores to themselves (pytest marker
# cores_alone: the DDP scenarios healthy and compute_straggler, one rank per core;
# the CPU loops judged against a free core) run after the rest, alone: beside
# another pytest worker the ranks competed for the 2 cores (tests/ddp/README.md).
# `make test ALONE_TESTS=` leaves them out.
ALONE_TESTS ?= tests/ddp tests/diagnosis/test_machine_loops.py \
  tests/pipeline/test_pipeline_scenarios.py tests/runtime/test_auto.py

# The pytest workers already take the cores, so tlog's query threads (DuckDB, polars;
# $TLOG_THREADS) are 1 there: more would only add synchronisation.
test: setup-spark
	TLOG_THREADS=1 POLARS_MAX_THREADS=1 $(BIN)/python -m pytest -q -rs $(TEST_ARGS) \
	  -m "not slow and not cores_alone"; rest=$$?; \
	  alone=0; if [ -n "$(ALONE_TESTS)" ]; then \
	    $(BIN)/python -m pytest -q -rs -m "cores_alone and not slow" $(ALONE_TESTS); alone=$$?; fi; \
	  exit $$(( rest != 0 ? rest : alone ))

bench: setup-spark
	$(BIN)/python -m benchmarks

lint: setup
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) tlog-reports .bench build *.egg-info
