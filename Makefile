# tlog: the two quick-start commands are `make demo` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# pip finds the on-disk torch CPU wheel here when the machine has it.
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)
PIP     := $(BIN)/pip install --disable-pip-version-check -q $(FIND_LINKS) -c constraints.txt

.PHONY: setup demo test bench lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(PIP) --upgrade pip setuptools wheel
	$(PIP) -e '.[dev,torch]'
	touch $(STAMP)

demo: setup
	$(BIN)/tlog demo

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python -m benchmarks

lint: setup
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) tlog-reports .bench build *.egg-info
