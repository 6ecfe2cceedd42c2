# The book's two jobs: `make book` renders it, `make test` checks it.
# Both create .venv in the repository and install everything they need.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# TensorFlow's C++ logs stay out of the test output and the executed chapters.
export TF_CPP_MIN_LOG_LEVEL := 3

CHAPTERS := $(sort $(wildcard chapters/*.py))

.PHONY: book test outputs chapter setup-cells clean help

help:
	@echo "make book         build the HTML book into _build/html (stored outputs, no execution)"
	@echo "make test         unit tests, every chapter under nbval, checks of the built book"
	@echo "make chapter NB=chapters/01_training_loop   re-execute one chapter, store its outputs"
	@echo "make outputs      re-execute every chapter and store fresh outputs"
	@echo "make setup-cells  write the Colab setup cell (address from _config.yml) into every chapter"

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

book: $(STAMP)
	$(VENV)/bin/jupyter-book build . --quiet -W -n --keep-going
	@echo "The book is built. Open: file://$(CURDIR)/_build/html/index.html"

# Unit tests of pargrad, checks of the built book, and every chapter under nbval.
test: book
	PARGRAD_REQUIRE_HTML=1 $(PY) -m pytest -p no:cacheprovider tests chapters \
	    --nbval --nbval-current-env --nbval-cell-timeout=180 --nbval-sanitize-with nbval_sanitize.cfg

chapter: $(STAMP)
	@test -n "$(NB)" || (echo "usage: make chapter NB=chapters/01_training_loop" && exit 2)
	cd tools && ../$(PY) run_chapter.py ../$(NB)

outputs: $(STAMP)
	cd tools && ../$(PY) run_chapter.py $(addprefix ../,$(CHAPTERS))

setup-cells: $(STAMP)
	cd tools && ../$(PY) setup_cells.py

clean:
	rm -rf _build
