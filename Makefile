# make demo   run the quickstart notebook against the built-in demo provider (writes out/)
# make test   lint, type-check, build the docs and run every test (creates .venv and installs what it needs)
# make check  the fast tier of the tests, for the edit loop (no cluster, kernel, browser, notebook or demo server; says its share)
# make docs   the documentation site into build/site/ (warnings are errors)
# make bench  run the benchmarks and print one table of ratios
# make generate  write again what is generated from the code (the run options' typed keywords)
# make fixtures  record again the fixtures notebooks 01 and 03 replay offline in the tests

PYTHON ?= python3
# The browser test drives this Chromium, the Redis tests start this redis-server, and the test of
# synced receipts watches a run's syscalls with strace (Debian's packages; installed here when
# missing).
CHROMIUM ?= /usr/bin/chromium
REDIS ?= /usr/bin/redis-server
STRACE ?= /usr/bin/strace
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
comma := ,

.PHONY: demo test check docs lint bench fixtures generate clean

# .venv with an editable install of the extras $(1), and a kernel for the notebooks. The project
# installs as the distribution playbook-df (PyPI's "playbook" is another project's); a .venv made
# while it was still called playbook holds that name too, which goes.
define install
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e ".[$(1)]"
	$(PY) -m pip uninstall -qq --yes playbook
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@
endef

$(STAMP): pyproject.toml
	$(call install,dev)

# The demo needs only the demo provider and a kernel to run the notebook in: a first `make demo`
# installs those, not the whole development set (`make test` adds the rest to the same .venv).
DEMO_STAMP := $(VENV)/.demo-installed
$(DEMO_STAMP): pyproject.toml
	$(call install,demo$(comma)notebook)

demo: $(DEMO_STAMP)
	$(PY) notebooks/run.py notebooks/01_quickstart.ipynb --out out

# Two workers, each taking whole test files (a notebook's cells run in order, in one kernel): most
# tests wait on servers, kernels and subprocesses, so two cores run the suite in about half the time.
test: $(STAMP) $(CHROMIUM) $(REDIS) $(STRACE) lint docs
	CHROMIUM=$(CHROMIUM) $(PY) -m pytest -q -n 2 --dist loadfile

# The edit loop: what needs no cluster, kernel, browser, notebook or demo server, and takes no
# seconds of its own (the demo provider is served in process there; `network` marks what needs it on
# a socket). A redis-server starts in milliseconds, so the tests that need one run here too. It ends
# saying its share of the tests ("check tier: N of M tests").
check: $(STAMP) $(REDIS)
	$(PY) -m pytest -q -n 2 -m "not (slow or cluster or kernel or browser or notebook or network)"

# The documentation site (mkdocs): a broken link, a missing page or reference is an error.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

# Lint, format and types: the same checks an editor shows.
lint: $(STAMP)
	$(VENV)/bin/ruff check playbook tests benchmarks
	$(VENV)/bin/ruff format --check playbook tests benchmarks
	$(VENV)/bin/mypy playbook

$(CHROMIUM):
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null

$(REDIS):
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null

$(STRACE):
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq strace >/dev/null

bench: $(STAMP)
	$(PY) -m benchmarks

# Each notebook runs against the demo provider from an empty store, recording every answer.
OFFLINE_NOTEBOOKS := 01_quickstart 03_resume_and_receipts
fixtures: $(STAMP)
	for nb in $(OFFLINE_NOTEBOOKS); do \
	  rm -f notebooks/fixtures/$$nb.jsonl; \
	  PLAYBOOK_FIXTURES=$(CURDIR)/notebooks/fixtures/$$nb.jsonl PLAYBOOK_FIXTURES_MODE=record \
	    $(PY) notebooks/run.py notebooks/$$nb.ipynb --out $$(mktemp -d) || exit 1; \
	done

clean:
	rm -rf $(VENV) out build dist *.egg-info .playbook

# The run options' TypedDicts, for type checkers, from their one declaration (RunOptions): a test
# fails when they are stale.
generate: $(STAMP)
	$(PY) -c "import playbook.frontends.signature as s; print('wrote', s.write_kwargs())"
