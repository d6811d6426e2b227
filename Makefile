# Sluice: every target sets itself up. `make run` and `make test` work on a fresh clone with Python 3.10+ and Java 17+.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := $(CURDIR)/.venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.sluice-installed

# The embedded default: Airflow home, data roots and Spark's Python, all inside the checkout.
export AIRFLOW_HOME ?= $(CURDIR)/.airflow
export AIRFLOW__CORE__DAGS_FOLDER := $(CURDIR)/dags
export AIRFLOW__CORE__PLUGINS_FOLDER := $(CURDIR)/plugins
export AIRFLOW__CORE__LOAD_EXAMPLES := False
export AIRFLOW__CORE__EXECUTOR ?= LocalExecutor
# LocalExecutor keeps one worker process per parallelism slot; each Spark run is heavy, and one machine runs few.
export AIRFLOW__CORE__PARALLELISM ?= 4
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS ?= True
export SLUICE_DATA_ROOT ?= $(CURDIR)/data
export PYSPARK_PYTHON := $(BIN)/python
export PYSPARK_DRIVER_PYTHON := $(BIN)/python
export PATH := $(BIN):$(PATH)
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: help
help:  ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'

.PHONY: prerequisites
prerequisites:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "Sluice needs Python 3.10+; found " + sys.version.split()[0])'
	@command -v java >/dev/null || { echo "Sluice needs Java 17+ on PATH (Spark runs on the JVM)"; exit 1; }
	@java -version 2>&1 | awk -F'"' '/version/ { split($$2, v, "."); if (v[1] < 17) { print "Sluice needs Java 17+; found " $$2; exit 1 } }'

$(STAMP): requirements.txt pyproject.toml
	@$(MAKE) --no-print-directory prerequisites
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $@

.PHONY: venv
venv: $(STAMP)  ## create .venv and install the pinned requirements (done by every target on first use)

$(AIRFLOW_HOME)/airflow.db: $(STAMP)
	mkdir -p $(AIRFLOW_HOME)
	$(BIN)/airflow db migrate >/dev/null

.PHONY: run
run: $(AIRFLOW_HOME)/airflow.db  ## Airflow standalone with the ingest DAGs on their schedules, fed by the demo producer
	@mkdir -p $(SLUICE_DATA_ROOT)
	@echo "Demo producer: a round of events every 60 s into $(SLUICE_DATA_ROOT)/landing"
	@$(BIN)/python -m sluice.demo_producer --landing-root $(SLUICE_DATA_ROOT)/landing --loop --interval 60 \
		> $(AIRFLOW_HOME)/producer.log 2>&1 & echo $$! > $(AIRFLOW_HOME)/producer.pid
	@echo "Airflow UI: http://localhost:8080 (ingest DAGs run on their cron schedules). Ctrl-C, then 'make stop'."
	@trap 'kill $$(cat $(AIRFLOW_HOME)/producer.pid) 2>/dev/null' EXIT; \
		AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION=False $(BIN)/airflow standalone

.PHONY: stop
stop:  ## stop what `make run` started: Airflow standalone, its LocalExecutor workers, the demo producer
	@kill $$(cat $(AIRFLOW_HOME)/producer.pid 2>/dev/null) 2>/dev/null || true
	@for signal in TERM KILL; do \
		for pid in $$(pgrep -f 'airflow|sluice.demo_producer'); do \
			[ $$pid = $$$$ ] && continue; \
			{ tr '\0' '\n' < /proc/$$pid/environ; } 2>/dev/null | grep -qxF "AIRFLOW_HOME=$(AIRFLOW_HOME)" \
				&& kill -$$signal $$pid 2>/dev/null; \
		done; \
		[ $$signal = KILL ] || sleep 10; \
	done; true
	@echo "stopped Airflow and the producer of $(AIRFLOW_HOME)"

.PHONY: demo
demo: $(AIRFLOW_HOME)/airflow.db  ## headless: produce events, `airflow dags test` an ingest DAG, print a summary
	$(BIN)/python -m sluice.demo

.PHONY: status
status: $(STAMP)  ## every stream's lag status, backlog, last commit and checkpoint health (STATUS_ARGS=--reasons)
	@$(BIN)/python -m sluice.status $(STATUS_ARGS)

# The Airflow tests that use the metadata database; the Postgres tier runs them again on PostgreSQL.
POSTGRES_TESTS := tests/airflow/test_metadata_db.py tests/airflow/test_dag_e2e.py tests/airflow/test_lag_airflow.py
# The reset test repeats the repair DAG's database paths of the backup test with two more Spark runs; on 2 cores
# it is left to the SQLite tier to keep the whole suite near 20 minutes.
POSTGRES_SELECT := not reset_through_the_repair_dag

.PHONY: test
test: $(STAMP)  ## every tier: the whole suite on SQLite, then the Airflow end-to-end tests on PostgreSQL
	@$(MAKE) --no-print-directory test-sqlite
	@$(MAKE) --no-print-directory test-postgres

.PHONY: test-sqlite
test-sqlite: $(STAMP)  ## the whole suite (unit, Spark, Airflow end-to-end) with Airflow's metadata in SQLite
	SLUICE_TEST_AIRFLOW_DB= $(BIN)/python -m pytest $(PYTEST_ARGS)

.PHONY: test-postgres
test-postgres: $(STAMP)  ## the Airflow end-to-end tests on a throwaway PostgreSQL (installed when missing, as root)
	bash tests/postgres.sh $(BIN)/python -m pytest -m airflow -k "$(POSTGRES_SELECT)" $(POSTGRES_TESTS) $(PYTEST_ARGS)

.PHONY: test-unit
test-unit: $(STAMP)  ## the unit tier only (no JVM, no Airflow database)
	$(BIN)/python -m pytest -m "not spark and not airflow" $(PYTEST_ARGS)

.PHONY: lint
lint: $(STAMP)  ## ruff and mypy
	$(BIN)/ruff check include plugins spark_apps dags tests bench
	$(BIN)/mypy include plugins

.PHONY: bench
bench: $(STAMP)  ## benchmarks: ingest (Delta sink vs Parquet sink, BENCH_ROWS=1000000), health check, lag check, MERGE vs append
	$(BIN)/python bench/bench_ingest.py --rows $${BENCH_ROWS:-1000000}
	$(BIN)/python bench/bench_health.py
	$(BIN)/python bench/bench_lag.py
	$(BIN)/python bench/bench_merge.py

.PHONY: freeze
freeze: $(STAMP)  ## rewrite requirements.txt from the environment after an upgrade
	{ sed -n '1,2p' requirements.txt; $(BIN)/python -m pip freeze --exclude-editable | grep -v '^sluice'; } > requirements.txt.new
	mv requirements.txt.new requirements.txt

.PHONY: clean
clean:  ## remove data, Airflow home and caches (keeps .venv)
	rm -rf $(SLUICE_DATA_ROOT) $(AIRFLOW_HOME) .pytest_cache .ruff_cache .mypy_cache spark-warehouse
