# The book's two jobs: `make book` renders it, `make test` checks it.
# Both create .venv in the repository and install everything they need.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# TensorFlow's C++ logs stay out of the test output and the executed chapters.
export TF_CPP_MIN_LOG_LEVEL := 3

CHAPTERS := $(sort $(wildcard chapters/*.py))

.PHONY: venv lint unit colab-venv browser-deps book test test-first-pass test-timed-pass \
        test-other-numerics test-stress test-colab test-oldest outputs chapter \
        setup-cells clean help book-static test-browser

help:
	@echo "make book         build the HTML book into _build/html (stored outputs, no execution)"
	@echo "make venv         create .venv and install the pinned requirements and pargrad"
	@echo "make lint         the linter (ruff: unused imports, undefined names)"
	@echo "make unit         the library's and the book layer's unit tests (tests/test_*.py,"
	@echo "                  tests/book/) in JOBS=2 processes, without the chapters and the"
	@echo "                  claim, clusters and timing items; prints the 10 slowest"
	@echo "make test         lint, unit tests, every chapter under nbval, checks of the built"
	@echo "                  book, then test-stress and test-other-numerics; the tests run in"
	@echo "                  JOBS=2 processes (pytest-xdist), those that time work alone after"
	@echo "make test-first-pass  make test's first part alone: everything not timed, in JOBS processes"
	@echo "make test-timed-pass  make test's second part alone: the timed items, one at a time"
	@echo "make test-other-numerics  the claims again without oneDNN, one thread an op (JOBS processes)"
	@echo "make test-stress  the multi-process measurements 10 times in a row (part of make test)"
	@echo "make test-colab   every chapter executed as on Colab: another TensorFlow, pargrad from"
	@echo "                  a git URL with its declared dependencies, no requirements.txt;"
	@echo "                  JOBS chapters at a time, each in its own kernel, the timed ones alone"
	@echo "make test-oldest  unit tests on the oldest TensorFlow and Keras pargrad allows"
	@echo "make test-browser the book's widgets and offline MathJax in headless Chromium"
	@echo "                  (installs Chromium with apt-get when run as root)"
	@echo "make chapter NB=chapters/01_training_loop   re-execute one chapter, store its outputs"
	@echo "make outputs      tune the stale-gradient chapters' methods again, then re-execute"
	@echo "                  every chapter and store fresh outputs"
	@echo "make setup-cells  write the Colab setup cell (address from _config.yml) into every chapter"

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

# Only the environment: .venv with the pinned requirements and pargrad (editable).
venv: $(STAMP)

book: $(STAMP) book-static
	$(VENV)/bin/jupyter-book build . --quiet -W -n --keep-going
	@echo "The book is built. Open: file://$(CURDIR)/_build/html/index.html"

# MathJax from the book's own static files (_config.yml: mathjax_path), so
# that the mathematics renders offline: copied from the npm package pinned in
# package-lock.json, again only when the lock changes.  Without npm the book
# still builds, with a stub that loads MathJax from its CDN as Sphinx does by
# default (the math then needs a network): a reader who only wants the HTML
# should not need Node.js, and nothing renders worse than before.
# `make test-browser` fails on the stub, so CI always serves MathJax itself.
MATHJAX_DIR   := _vendor/mathjax
MATHJAX_STAMP := $(MATHJAX_DIR)/.from-npm
MATHJAX_FILES := tex-mml-chtml.js a11y adaptors input output sre ui
MATHJAX_CDN   := https://cdn.jsdelivr.net/npm/mathjax@3.2.2/es5/tex-mml-chtml.js

# Sphinx copies static files only when some page is rebuilt: when the
# widgets' files differ from the built copies, the pages are rebuilt too.
book-static:
	@if [ -d _build/html/_static/widgets ] && \
	    ! diff -rq book_static/widgets _build/html/_static/widgets >/dev/null 2>&1; then \
	    echo "The widgets changed: every page is rebuilt"; rm -rf _build/.doctrees; \
	fi
	@if command -v npm >/dev/null 2>&1; then \
	    if [ ! -f $(MATHJAX_STAMP) ] || [ package-lock.json -nt $(MATHJAX_STAMP) ]; then \
	        echo "Vendoring MathJax (package-lock.json) into $(MATHJAX_DIR)"; \
	        npm ci --no-audit --no-fund --loglevel=error && rm -rf $(MATHJAX_DIR) && \
	        mkdir -p $(MATHJAX_DIR) && \
	        cp -R $(addprefix node_modules/mathjax/es5/,$(MATHJAX_FILES)) $(MATHJAX_DIR)/ && \
	        touch $(MATHJAX_STAMP) && rm -rf _build/.doctrees; \
	    fi; \
	elif [ -f $(MATHJAX_STAMP) ]; then \
	    echo "npm not found: keeping the MathJax vendored before, in $(MATHJAX_DIR)"; \
	else \
	    echo "npm not found: MathJax is not vendored; the book's pages will load it from"; \
	    echo "its CDN and show raw TeX offline. Install Node.js and npm, then make book again."; \
	    rm -rf $(MATHJAX_DIR) && mkdir -p $(MATHJAX_DIR) && \
	    printf '%s\n' "/* npm was missing when the book was built: MathJax from its CDN. */" \
	        "(function () { var s = document.createElement('script');" \
	        "  s.src = '$(MATHJAX_CDN)'; s.async = true; document.head.appendChild(s); })();" \
	        > $(MATHJAX_DIR)/tex-mml-chtml.js; \
	fi

# Two test processes at once: the book's TensorFlow work is tiny operations that keep one core
# of a process busy, so one pytest process uses one core of CI's two.  JOBS=1 runs everything in
# one process, as before.  What may not run beside another process comes from the marks
# (tests/conftest.py reads them; a chapter's are in tools/marks.py):
# * items marked `timing` (chapters that time work, tests that assert on wall-clock time or
#   speed ratios) run in a second pass, alone, one at a time, with no other test process
#   beside them (the stress run below is serial too);
# * a notebook's cells and a test file's tests stay in one process, in order (one kernel, one
#   module's fixtures and state);
# * every file marked `clusters` (it starts multi-process clusters) is in one unit of work,
#   "clusters" (--dist loadfile with tests/conftest.py's scheduler), run in one process one
#   file after the other: two clusters never start at once, and each test process takes its
#   clusters' ports from its own block outside the kernel's ephemeral range, so that no other
#   process's cluster or Jupyter kernel can pick them.
JOBS  ?= 2
XDIST := -n $(JOBS) --dist loadfile --no-loadscope-reorder
PYTEST := $(PY) -m pytest -p no:cacheprovider

NBVAL := --nbval --nbval-current-env --nbval-cell-timeout=180 --nbval-sanitize-with nbval_sanitize.cfg

# pyflakes' checks through ruff (pyproject.toml's [tool.ruff]): a second or two.
lint: $(STAMP)
	$(VENV)/bin/ruff check --no-cache .

# The contributor's loop between `make lint` and `make test` (a few minutes): the unit
# tests of the library (tests/test_*.py) and of the book layer (tests/book/), in JOBS
# processes, without what makes `make test` long: the chapters, the claims (tests/claims/
# and the items marked `claim`, which make test runs twice), the files that start clusters
# and the items that time work (their marks: tests/conftest.py).  --durations=10 names the
# slowest.
UNIT_MARKS := not claim and not clusters and not timing

unit: $(STAMP)
	$(PYTEST) -n $(JOBS) --dist loadfile --durations=10 -m "$(UNIT_MARKS)" \
	    $(wildcard tests/test_*.py) tests/book

# The second pass collects only the files that hold `timing` items (the test files that
# name the mark, the chapters tools/marks.py marks), not the whole suite a second time.
TIMED_TESTS = $(shell grep -rl --include='test_*.py' 'pytest.mark.timing' tests | sort)

# The linter first; unit tests of pargrad, checks of the built book, every
# chapter under nbval (in JOBS processes, then the `timing` items alone: see
# JOBS above); then the stress runs and the book's claims under other numerics.
# Each part is a target of its own, so that .ci/run times them one by one
# (test-first-pass and test-timed-pass check the book that `make book` built).
test: lint book
	$(MAKE) --no-print-directory -o book test-first-pass
	$(MAKE) --no-print-directory -o book test-timed-pass
	$(MAKE) --no-print-directory test-stress
	$(MAKE) --no-print-directory test-other-numerics

# Everything not marked `timing`, in JOBS processes: tests, claims, every chapter under nbval.
test-first-pass: $(STAMP) book
	PARGRAD_REQUIRE_HTML=1 $(PYTEST) $(XDIST) --durations=25 -m "not timing" tests chapters $(NBVAL)

# The `timing` items, alone, one at a time.
test-timed-pass: $(STAMP) book
	PARGRAD_REQUIRE_HTML=1 $(PYTEST) --durations=5 -m timing $(TIMED_TESTS) $(TIMED) $(NBVAL)

# The chapter "What communication costs"'s two- and three-worker all-reduce
# measurements, 10 runs each with small payloads, no retry, and one run of
# "Beyond one machine"'s parameter servers with a worker killed right after
# one of its updates (the unit tests run that race once more): a race at a
# cluster's end fails here before it fails on a reader's machine.
# (tools/stress_clusters.py --runs 50 and
# --runs 0 --kills 30 are the long forms.)  One cluster at a time, alone: it
# times the all-reduces and aims a kill at a moment of a run.
test-stress: $(STAMP)
	$(PY) tools/stress_clusters.py --runs 10 --quick --kills 1

# The claims again under another order of additions, as on another CPU or a
# GPU: no oneDNN kernels, one thread in each operation.  A number or an
# equality that holds only on the machine that made the outputs fails here.
# One pytest run: the claim tests and the chapters below, in JOBS processes
# grouped as in `make test` (one thread an operation: one core a process).
# Left out, besides the order_free chapters: test files marked order_free
# (pytestmark), whose claim items compare outputs this run compares anyway
# (tests/claims/test_programs.py: the programs' outputs, which nbval compares
# in their chapters).  tests/repository/test_other_numerics.py fails for a
# claim item that runs no TensorFlow, which these settings cannot change.
OTHER_NUMERICS := TF_ENABLE_ONEDNN_OPTS=0 TF_NUM_INTRAOP_THREADS=1 OMP_NUM_THREADS=1

# Every chapter whose checked outputs TensorFlow computes: those not marked
# `order_free` in tools/marks.py, which gives each left-out chapter's reason
# (device lists and timings, float64 NumPy replays whose TensorFlow side is
# claim-marked, equalities bit for bit under any numerics, ...).
NUMERIC_CHAPTERS := $(shell $(PYTHON) tools/marks.py --without order_free)
# The test files that hold `claim` items: each worker collects these, not the whole suite.
CLAIM_TESTS = $(shell grep -rl --include='test_*.py' 'pytest.mark.claim' tests | sort)
# Chapters that time work and assert on the times (marked `timing` in
# tools/marks.py): never beside another job.
TIMED := $(shell $(PYTHON) tools/marks.py timing)

test-other-numerics: $(STAMP)
	$(OTHER_NUMERICS) $(PYTEST) $(XDIST) --durations=10 -m "(claim or notebook) and not order_free" \
	    $(CLAIM_TESTS) $(NUMERIC_CHAPTERS) $(NBVAL)

# Every chapter executed as a reader on Colab runs it: another TensorFlow
# (COLAB_TF), pargrad installed from this clone's last commit as a git URL
# with only its declared dependencies, nothing from requirements.txt, and
# the kernel and notebook runner Colab has.  Not compared with the stored
# outputs (another TensorFlow prints other digits); the chapters' asserts
# run.  JOBS chapters at a time, each in its own kernel; the chapters that
# time work and assert on it (TIMED) run alone after them.  Not part of
# `make test` (a reader's check needs no second TensorFlow), but .ci/run
# runs it.
COLAB    := .venv-colab
COLAB_TF ?= 2.19.0

# colab-venv: the runtime alone (another TensorFlow, the kernel, the runner),
# made again only when COLAB_TF changes; .ci/run makes it while `make test`
# runs (a download, not a computation).  test-colab then installs pargrad
# afresh from this clone's last commit into it.
COLAB_STAMP := $(COLAB)/.runtime-$(COLAB_TF)

$(COLAB_STAMP):
	rm -rf $(COLAB)
	$(PYTHON) -m venv $(COLAB)
	$(COLAB)/bin/python -m pip install --quiet --upgrade pip
	$(COLAB)/bin/python -m pip install --quiet "tensorflow==$(COLAB_TF)" ipykernel nbclient nbformat
	touch $(COLAB_STAMP)

colab-venv: $(COLAB_STAMP)

test-colab: $(COLAB_STAMP)
	$(COLAB)/bin/python -m pip uninstall --quiet --yes pargrad 2>/dev/null || true
	$(COLAB)/bin/python -m pip install --quiet "pargrad[book] @ git+file://$(CURDIR)@$$(git rev-parse HEAD)"
	cd chapters && TF_CPP_MIN_LOG_LEVEL=3 ../$(COLAB)/bin/python ../tools/execute_chapters.py \
	    --jobs $(JOBS) $(addprefix --alone ,$(notdir $(TIMED))) *.ipynb

# The book's widgets in a real browser (tests/browser): headless Chromium,
# driven by Selenium through Debian's chromium-driver, on the built book.
# Installs what it can (Chromium with apt-get when run as root; Selenium,
# pinned, into the venv) and says what is missing where it cannot.  Not part
# of `make test`, which needs no browser; .ci/run runs both.
BROWSER_STAMP := $(VENV)/.browser-installed

$(BROWSER_STAMP): requirements-browser.txt $(STAMP)
	$(PY) -m pip install --quiet -r requirements-browser.txt
	touch $(BROWSER_STAMP)

# Chromium and ChromeDriver alone (.ci/run fetches them while `make test` runs).
browser-deps:
	@if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then \
	    if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	        echo "Installing Debian's chromium and chromium-driver for the browser tests"; \
	        apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	            apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null; \
	    else \
	        echo "make test-browser needs Chromium and ChromeDriver on the PATH (chromium, chromedriver)."; \
	        echo "On Debian or Ubuntu, as root: apt-get install chromium chromium-driver"; \
	        exit 1; \
	    fi; \
	fi

test-browser: book $(BROWSER_STAMP) browser-deps
	PARGRAD_BROWSER_TESTS=1 $(PY) -m pytest -p no:cacheprovider tests/browser

# The unit tests with the oldest releases pyproject.toml allows
# (requirements-oldest.txt).  Not part of `make test`: installing a second
# TensorFlow takes minutes; run it when the declared versions change.
OLDEST       := .venv-oldest
OLDEST_STAMP := $(OLDEST)/.installed

$(OLDEST_STAMP): requirements-oldest.txt pyproject.toml
	$(PYTHON) -m venv $(OLDEST)
	$(OLDEST)/bin/python -m pip install --quiet --upgrade pip
	$(OLDEST)/bin/python -m pip install --quiet -r requirements-oldest.txt
	$(OLDEST)/bin/python -m pip install --quiet --no-deps -e .
	touch $(OLDEST_STAMP)

test-oldest: $(OLDEST_STAMP)
	$(OLDEST)/bin/python -m pytest -p no:cacheprovider -q tests/repository/test_versions.py \
	    tests/test_devices.py tests/test_sync.py tests/test_sync_cluster.py tests/test_accumulate.py tests/test_tf1.py \
	    tests/test_asynchronous.py tests/test_sharded.py tests/test_memory.py tests/test_losses.py

chapter: $(STAMP)
	@test -n "$(NB)" || (echo "usage: make chapter NB=chapters/01_training_loop" && exit 2)
	cd tools && ../$(PY) run_chapter.py ../$(NB)

# The cheap stored runs the chapters read (the tuning pools of "Asynchronous training" and
# "Stale gradients in depth", three minutes), then every chapter.  The slower stored runs
# (the race, "Communicating rarely") have their own tools, named in CONTRIBUTING.md.
outputs: $(STAMP)
	PYTHONPATH=$(CURDIR):$(CURDIR)/tools $(PY) tools/measure_tuned_stale_gradients.py
	cd tools && ../$(PY) run_chapter.py $(addprefix ../,$(CHAPTERS))

setup-cells: $(STAMP)
	cd tools && ../$(PY) setup_cells.py

clean:
	rm -rf _build
