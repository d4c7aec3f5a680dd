# The two set-up-free entry points: `make test` and `make stress ITER=100`.
# Each finds a python that has torch, triton, pytest, xdist and hypothesis, or builds .venv.
PY := $(shell bash tools/ensure_env.sh)
ITER ?= 100
SEED ?= 0
JOBS ?=
REPORT ?= reports/stress
SELECT = $(if $(CHECK),--check $(CHECK)) $(if $(DEVICE),--device $(DEVICE))
STRESS_ARGS = --iters $(ITER) --seed $(SEED) --report $(REPORT) $(SELECT) $(if $(FAMILY),--family $(FAMILY)) \
	$(if $(JOBS),--jobs $(JOBS))

.PHONY: test stress mutants bench lint env

env:
	@echo $(PY)

test:
	$(PY) -m pytest -n auto -q

# The kill matrix runs even when the replay found failures: both halves are reported, either fails the target.
stress:
	$(PY) -m stress run $(STRESS_ARGS); rc=$$?; \
	$(PY) -m stress mutants $(SELECT) --report $(REPORT) || rc=1; exit $$rc

mutants:
	$(PY) -m stress mutants $(SELECT)

bench:
	$(if $(DEVICE),SPECSAN_DEVICE=$(DEVICE)) $(PY) -m stress.bench

lint:
	$(PY) -m ruff check .
