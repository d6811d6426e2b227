# Sluice: every target sets itself up. `make run` and `make test` work on a fresh clone with Python 3.10+ and Java 17+.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := $(CURDIR)/.venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.sluice-installed
# The JVM jars of include/jvm/pom.xml, resolved by Maven (python -m sluice jars): delta-spark, Spark's Kafka connector,
# hadoop-aws, and the Kafka broker and the Iceberg REST catalog server of the tests. Resolved again only when the
# project file changes.
JARS_STAMP := $(VENV)/share/sluice/jars/.pom-sha256
# Sluice's own JVM classes (include/jvm/drift: the JSON drift check, the session extension that holds a batch's timestamp
# out of its generated code), compiled against pyspark's jars; built again only when a source changes. Without a JDK the
# command says so and builds nothing: the check and every batch then run slower.
CLASSES_JAR := $(VENV)/share/sluice/jars/sluice/sluice-drift.jar
INSTALLED := $(STAMP) $(JARS_STAMP) $(CLASSES_JAR)

# The embedded default: Airflow home, data roots and Spark's Python, all inside the checkout.
export AIRFLOW_HOME ?= $(CURDIR)/.airflow
export AIRFLOW__CORE__DAGS_FOLDER := $(CURDIR)/dags
export AIRFLOW__CORE__PLUGINS_FOLDER := $(CURDIR)/plugins
export AIRFLOW__CORE__LOAD_EXAMPLES := False
export AIRFLOW__CORE__EXECUTOR ?= LocalExecutor
# LocalExecutor keeps one worker process per parallelism slot; each Spark run is heavy, and one machine runs few.
export AIRFLOW__CORE__PARALLELISM ?= 4
# The scheduler sleeps this long when a loop found nothing to do; a small run waits for such a sleep before it starts,
# after it ends, and between tasks. Half of Airflow's 1 s, for about 2% more of a core while idle (docs/performance/cost.md).
export AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME ?= 0.5
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

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml include/sluice/operations/pyspark_bytecode.py
	@$(MAKE) --no-print-directory prerequisites
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@# requirements-dev.txt: the runtime pins (requirements.txt, all the images install) and the tools of tests, lint, docs.
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	@# Bytecode in the PySpark zip that Spark's Python processes load first (docs/performance/cost.md): without it, only slower.
	$(BIN)/python -m sluice pyspark-bytecode || echo "make: no bytecode in PySpark's zip; Spark's Python processes compile it"
	@# The Spark driver's class archive (docs/performance/cost.md): cold runs start seconds sooner; without one, only slower.
	$(BIN)/python -m sluice jvm-archive || echo "make: no Spark driver archive was recorded; runs start without it"
	touch $@

$(JARS_STAMP): include/jvm/pom.xml $(STAMP)
	@# Without Maven it says what needs the jars and writes no stamp, so that a later make (with Maven) resolves them.
	$(BIN)/python -m sluice jars && { test ! -f $@ || touch $@; }

$(CLASSES_JAR): $(wildcard include/jvm/drift/sluice/*/*.java) $(STAMP)
	$(BIN)/python -m sluice jvm-classes

.PHONY: venv
venv: $(INSTALLED)  ## create .venv, install the pinned runtime and development requirements and the JVM jars (done by every target on first use)

$(AIRFLOW_HOME)/airflow.db: $(INSTALLED)
	mkdir -p $(AIRFLOW_HOME)
	$(BIN)/airflow db migrate >/dev/null

# Where `make run` serves the Airflow UI and REST API: this machine only, unless asked on the command line
# (`make run HOST=0.0.0.0 PORT=8081`). The environment does not set them: some shells export HOST as the machine's
# name, and that would open the API to the network without anyone asking.
HOST = 127.0.0.1
PORT = 8080
# Seconds `make stop` gives each session of `make run` to exit after SIGTERM, before SIGKILL.
STOP_TIMEOUT = 30
# `make run`, `make stop` and `make clean` are include/sluice/cli/devserver.py. It needs only the standard library, so
# `make stop` and `make clean` run on $(PYTHON) before the venv exists.
DEVSERVER = PYTHONPATH="$(CURDIR)/include" $(PYTHON) -m sluice.cli.devserver
WHERE = --airflow-home "$(AIRFLOW_HOME)" --data-root "$(SLUICE_DATA_ROOT)"

# `make run WARM=1`: warm mode. A warm server (one resident Spark driver) starts first, and the stream runs go to it
# instead of a spark-submit each (docs/performance/cost.md).
WARM =
# `make run KAFKA=1`: a local Kafka broker (KRaft, 127.0.0.1) starts first; the demo producer also sends its events to
# the topic demo.events, and the stream events_kafka_bronze (include/sluice/streams_kafka.yaml) ingests them.
KAFKA =

.PHONY: run
run: $(AIRFLOW_HOME)/airflow.db  ## Airflow on 127.0.0.1:8080 (HOST=, PORT=, WARM=1, KAFKA=1), the DAGs on schedule, a producer
	@$(BIN)/python -m sluice.cli.devserver run --host "$(HOST)" --port "$(PORT)" --stop-timeout "$(STOP_TIMEOUT)" \
		$(if $(filter 1 true yes,$(WARM)),--warm) $(if $(filter 1 true yes,$(KAFKA)),--kafka) $(WHERE)

.PHONY: stop
stop:  ## stop exactly what `make run` started: Airflow, its task and Spark processes, the producer
	@$(DEVSERVER) stop --stop-timeout "$(STOP_TIMEOUT)" $(WHERE)

.PHONY: demo
demo: $(AIRFLOW_HOME)/airflow.db  ## headless: produce events, `airflow dags test` an ingest DAG, print a summary
	$(BIN)/python -m sluice demo

.PHONY: status
status: $(INSTALLED)  ## every stream's lag status, backlog, last commit and checkpoint health (STATUS_ARGS=--reasons)
	@$(BIN)/python -m sluice status $(STATUS_ARGS)

# The Airflow tests that use the metadata database; the Postgres tier runs them again on PostgreSQL.
POSTGRES_TESTS := tests/airflow/test_metadata_db.py tests/airflow/test_dag_e2e.py tests/airflow/test_lag_airflow.py
# The reset test repeats the repair DAG's database paths of the backup test with two more Spark runs; on 2 cores
# it is left to the SQLite tier to keep the whole suite near 20 minutes.
POSTGRES_SELECT := not reset_through_the_repair_dag

.PHONY: test
test: $(INSTALLED)  ## every tier: the whole suite on SQLite, then the Airflow end-to-end tests on PostgreSQL
	@$(MAKE) --no-print-directory test-sqlite
	@$(MAKE) --no-print-directory test-postgres

.PHONY: test-sqlite
test-sqlite: $(INSTALLED)  ## the whole suite (unit, Spark, Airflow end-to-end, the browser) with Airflow's metadata in SQLite
	@bash tests/chromium.sh
	SLUICE_TEST_AIRFLOW_DB= $(BIN)/python -m pytest $(PYTEST_ARGS)

.PHONY: test-postgres
test-postgres: $(INSTALLED)  ## the Airflow end-to-end tests on a throwaway PostgreSQL (installed when missing, as root)
	bash tests/postgres.sh $(BIN)/python -m pytest -m airflow -k "$(POSTGRES_SELECT)" $(POSTGRES_TESTS) $(PYTEST_ARGS)

.PHONY: test-unit
test-unit: $(INSTALLED)  ## the unit tier only: starts no JVM, Airflow database, Kafka broker or S3 server, installs nothing
	$(BIN)/python -m pytest -m "not spark and not airflow and not kafka and not s3" $(PYTEST_ARGS)

.PHONY: lint
lint: $(INSTALLED)  ## ruff (include plugins spark_apps dags tests bench docs .ci), mypy (include plugins spark_apps), import-linter
	$(BIN)/ruff check include plugins spark_apps dags tests bench docs .ci
	$(BIN)/mypy include plugins spark_apps
	$(BIN)/lint-imports

.PHONY: bench
bench: $(INSTALLED)  ## benchmarks: ingest (Delta sink vs Parquet sink, BENCH_ROWS=1000000), the two Delta engines, Kafka into Delta vs plain Spark, expectations and a SQL transform vs none, the rescue policy vs none, health check, lag check, MERGE vs append, the Streams page, a run's cost, a group of streams, history, CDC type 1 vs merge, the Iceberg sink vs the rs Delta sink
	$(BIN)/python bench/bench_ingest.py --rows $${BENCH_ROWS:-1000000}
	$(BIN)/python bench/bench_engines.py --rows $${BENCH_ROWS:-1000000}
	$(BIN)/python bench/bench_kafka.py --records $${BENCH_ROWS:-1000000}
	$(BIN)/python bench/bench_rules.py --rows $${BENCH_ROWS:-1000000}
	$(BIN)/python bench/bench_drift.py --rows $${BENCH_ROWS:-1000000}
	$(BIN)/python bench/bench_health.py
	$(BIN)/python bench/bench_lag.py
	$(BIN)/python bench/bench_merge.py
	$(BIN)/python bench/bench_streams_page.py
	$(BIN)/python bench/bench_run_cost.py
	$(BIN)/python bench/bench_multi.py
	$(BIN)/python bench/bench_history.py
	$(BIN)/python bench/bench_cdc.py
	$(BIN)/python bench/bench_iceberg.py --rows $${BENCH_ROWS:-1000000}

.PHONY: freeze
freeze: $(INSTALLED)  ## rewrite requirements.txt (runtime) and requirements-dev.txt from the environment after an upgrade
	$(BIN)/python .ci/freeze.py

.PHONY: docs
docs: $(INSTALLED)  ## build the documentation site into site/ (mkdocs build --strict; references generated from the code)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

.PHONY: schema
schema: $(INSTALLED)  ## rewrite the catalog's JSON Schema (include/sluice/catalog/streams.schema.json) from the code
	$(BIN)/python -m sluice catalog-schema --write

.PHONY: clean
clean:  ## remove data, Airflow home and caches, if they are inside the checkout (keeps .venv)
	@$(DEVSERVER) clean --checkout "$(CURDIR)" $(WHERE)
