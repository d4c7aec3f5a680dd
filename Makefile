# The two set-up-free entry points: `make test` and `make stress ITER=100`.
# Each finds a python that has torch, triton, pytest, xdist and hypothesis, or builds .venv.
PY := $(shell bash tools/ensure_env.sh)
ITER ?= 100
SEED ?= 0
JOBS ?=
BUILDERS ?=
REPORT ?= reports/stress
JUNIT ?= reports/junit.xml
SELECT = $(if $(CHECK),--check $(CHECK)) $(if $(DEVICE),--device $(DEVICE))
STRESS_ARGS = $(if $(PATH_COLUMN),--path) --hunt --iters $(ITER) --seed $(SEED) --report $(REPORT) $(SELECT) $(if $(FAMILY),--family $(FAMILY)) \
	$(if $(JOBS),--jobs $(JOBS)) $(if $(BUILDERS),--builders $(BUILDERS)) $(if $(RESUME),--resume $(RESUME))

# RESUME=reports/stress: go on after a stopped run (the cases it finished are carried; docs/usage.md).
# SANITIZE=1: then a sampled compute-sanitizer memcheck pass, a few cases per check and family.
SANITIZE_ITERS ?= 2
SANITIZE_ARGS = --iters $(SANITIZE_ITERS) --seed $(SEED) --report $(REPORT)/sanitize --baseline $(REPORT) $(SELECT) \
	$(if $(FAMILY),--family $(FAMILY))

.PHONY: test test-quick stress mutants mutate bench lint env

env:
	@echo $(PY)

# JUnit XML for CI (each registry case's repro line is a property of its test case). `test` is the whole suite;
# `test-quick`, the pull-request subset, leaves out the tests marked slow (3 s or more each on a CPU core) and
# still replays, traces and kills a planted bug of every check (docs/testing.md). The slow tests are collected
# first (conftest.py) and worksteal lets an idle worker take queued tests from a busy one.
# ARGS: pytest arguments, e.g. ARGS="tests/test_block_table.py -k shift" for one kernel's tests (docs/testing.md).
ARGS ?=
test:
	$(PY) -m pytest -n auto --dist worksteal -q --junitxml=$(JUNIT) $(ARGS)

test-quick:
	$(PY) -m pytest -n auto --dist worksteal -q -m "not slow" --junitxml=$(JUNIT) $(ARGS)

# One process, one report: the race hunts, then the replay and the kill matrix on the same workers (the matrix
# is decided even where the replay fails: either half fails the target). A bad argument stops it before anything runs (exit 2).
stress:
	$(PY) -m stress run $(STRESS_ARGS) --kill-matrix$(if $(SANITIZE),; status=$$?; \
	$(PY) -m stress sanitize $(SANITIZE_ARGS) || status=$$(( status ? status : 1 )); exit $$status)

mutants:
	$(PY) -m stress mutants $(SELECT)

# Generated mutants of every check's production code (all of them, on the current device): the
# mutation score per check and module, every survivor with its rerun line. MUTATE_ITERS cases per
# family per mutant; SAMPLE=N takes N mutants per check; MODULES="kernels.spec.engine ..." only the code
# of those modules. OPERATORS=token|semantic|all picks the one-token slips (the default), an engineer's
# semantic slips, or both; each class is scored apart.
# RESUME=old/mutate.jsonl takes what an earlier run of the same device, iters and seed decided and
# hunts only the rest (a run split over several sessions of device time). HUNT_SECONDS=N stops starting
# cases after N seconds of hunting and leaves the time after it to memcheck and the unit tests.
MUTATE_ITERS ?= 3
MUTATE_REPORT ?= reports/mutate
mutate:
	$(PY) -m stress mutate $(SELECT) --iters $(MUTATE_ITERS) $(if $(SAMPLE),--sample $(SAMPLE)) \
		$(foreach m,$(MODULES),--module $(m)) \
		$(if $(JOBS),--jobs $(JOBS)) $(if $(RESUME),--resume $(RESUME)) \
		$(if $(HUNT_SECONDS),--hunt-seconds $(HUNT_SECONDS)) $(if $(OPERATORS),--operators $(OPERATORS)) \
		--report $(MUTATE_REPORT)

bench:
	$(if $(DEVICE),SPECSAN_DEVICE=$(DEVICE)) $(PY) -m stress.bench

lint:
	$(PY) -m ruff check .
