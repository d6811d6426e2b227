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

# Where `make run` serves the Airflow UI and REST API: this machine only, unless asked on the command line
# (`make run HOST=0.0.0.0 PORT=8081`). The environment does not set them: some shells export HOST as the machine's
# name, and that would open the API to the network without anyone asking.
HOST = 127.0.0.1
PORT = 8080
# Seconds `make stop` gives each session of `make run` to exit after SIGTERM, before SIGKILL.
STOP_TIMEOUT = 30

# Nobody logs in (every user is an admin) only on a loopback address, and only while the environment does not turn it
# off; any other address needs the simple auth manager's login: user admin, password generated into PASSWORDS_FILE.
ON_LOOPBACK := $(filter 127.0.0.1 localhost ::1,$(HOST))
ALL_ADMINS := $(if $(ON_LOOPBACK),$(or $(AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS),True),False)
GENERATED_PASSWORDS = $(AIRFLOW_HOME)/simple_auth_manager_passwords.json.generated
PASSWORDS_FILE = $(or $(AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE),$(GENERATED_PASSWORDS))
url_host = $(if $(findstring :,$(1)),[$(1)],$(1))
# The address the local processes (LocalExecutor's workers, the health check) use to reach the API server.
API_REACH = $(if $(filter 0.0.0.0 ::,$(HOST)),127.0.0.1,$(HOST))
RUN_URL = http://$(call url_host,$(HOST)):$(PORT)
LOCAL_URL = http://$(call url_host,$(API_REACH)):$(PORT)

# What `make run` started: one line "<name> <pid> <start time>" per session, in the order `make stop` stops them. The
# pid is the session leader's, and so the session id; the start time (clock ticks after boot, field 22 of
# /proc/<pid>/stat) proves that the pid still belongs to that leader, not to a process that got the number since.
RUN_RECORD = $(AIRFLOW_HOME)/make-run.sessions
# Starts a command as the leader of a new session, without a fork: its pid is the session id. The signals an exec
# would leave ignored go back to their defaults: SIGPIPE and SIGXFSZ (ignored by Python's start-up), SIGINT and
# SIGQUIT (ignored by the shell for a command it runs in the background).
SPAWN = $(BIN)/python -c 'import os, signal, sys; \
	[signal.signal(number, signal.SIG_DFL) for number in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, \
	signal.SIGQUIT)]; os.setsid(); os.execvp(sys.argv[1], sys.argv[1:])'
# The two sessions of `make run` are the components of `airflow standalone` and the demo producer: first the
# scheduling session, then the API server, which the task processes report their end to, so it is stopped last.
# Standalone's scheduler and triggerer would also open log servers on every address (8793, 8794); on one machine the
# API server reads the task logs from their files, so they are skipped. A session's leader and the filters that prefix
# each component's lines outlive SIGTERM: the components' last lines still reach the terminal, and `make run` sees a
# session end only when all its components have.
COMPONENT = \
	trap : TERM; \
	component() { \
		prefix=$$(printf "%-10s | " "$$1"); shift; \
		"$$@" 2>&1 | { trap "" TERM; exec sed -u "s/^/$$prefix/"; } & \
	};
SCHEDULING_SESSION = $(COMPONENT) \
	component scheduler airflow scheduler --skip-serve-logs; \
	component dag-proc airflow dag-processor; \
	component triggerer airflow triggerer --skip-serve-logs; \
	python -m sluice.demo_producer --landing-root "$$SLUICE_DATA_ROOT/landing" --loop --interval 60 \
		>> "$$AIRFLOW_HOME/producer.log" 2>&1 & \
	until wait; do :; done
API_SESSION = $(COMPONENT) component api-server airflow api-server; until wait; do :; done
# Reads /proc/<pid>/stat of every process. Prints "<pid>:<start time>" of each live process (a zombie has exited) of
# the recorded sessions (only the one led by pid `only`, when given) whose leader, when still alive, has the recorded
# start time, and of each of their descendants (spark-submit runs in a session of its own). With notes=1 it says
# which recorded pids now belong to other processes.
MEMBERS_AWK = \
	BEGIN { \
	  while ((getline line < record) > 0) { \
	    split(line, field, " "); if (field[3] != "" && (only == "" || only == field[2])) leader[field[2]] = field[3] } } \
	{ pid = $$1; rest = $$0; sub(/^.*\) /, "", rest); split(rest, field, " "); \
	  if (field[1] == "Z" || field[1] == "X") next; \
	  parent[pid] = field[2]; session[pid] = field[4]; start[pid] = field[20] } \
	END { \
	  for (id in leader) { \
	    if (!(id in start) || start[id] + 0 == leader[id] + 0) ours[id] = leader[id] + 0; \
	    else if (notes) print "make stop: pid " id " now belongs to another process; leaving it alone" > "/dev/stderr" } \
	  for (pid in session) if ((session[pid] in ours) && start[pid] + 0 >= ours[session[pid]]) mine[pid] = 1; \
	  do { grown = 0; for (pid in parent) if (!(pid in mine) && (parent[pid] in mine)) { mine[pid] = 1; grown = 1 } } \
	  while (grown); \
	  for (pid in mine) print pid ":" start[pid] }
# Shell functions of `make run` and `make stop` (they read /proc, so Linux). stop_session: SIGTERM to every process
# of one recorded session (or of all, without an argument), SIGKILL to what is left after STOP_TIMEOUT seconds.
SESSION_FUNCTIONS = \
	started_at() { sed 's/.*) //' /proc/$$1/stat 2>/dev/null | cut -d' ' -f20; }; \
	members() { \
		cat /proc/[0-9]*/stat 2>/dev/null \
		| awk -v record="$(RUN_RECORD)" -v notes="$${1:-}" -v only="$${2:-}" '$(MEMBERS_AWK)'; \
	}; \
	stop_session() { \
		alive=$$(members "" "$${1:-}"); signal=TERM; deadline=$$((SECONDS + $(STOP_TIMEOUT))); signalled=" "; \
		while [ -n "$$alive" ]; do \
			if [ $$SECONDS -ge $$deadline ]; then \
				if [ $$signal = KILL ]; then echo "make stop: still running after SIGKILL: $$alive" >&2; return 1; fi; \
				echo "make stop: SIGKILL to what still runs $(STOP_TIMEOUT) s after SIGTERM: $$alive" >&2; \
				signal=KILL; signalled=" "; deadline=$$((SECONDS + 10)); \
			fi; \
			for process in $$alive; do \
				case "$$signalled" in \
					*" $$process "*) ;; \
					*) kill -$$signal "$${process%%:*}" 2>/dev/null; signalled="$$signalled$$process "; \
					   [ $$signal = KILL ] || stopped=$$((stopped + 1)) ;; \
				esac; \
			done; \
			sleep 0.2; alive=$$(members "" "$${1:-}"); \
		done; \
	}; \
	stop_sessions() { \
		stopped=0; \
		if [ -z "$$(members 1)" ]; then \
			echo "Nothing that make run started is running (Airflow home $(AIRFLOW_HOME))"; rm -f "$(RUN_RECORD)"; \
			return 0; \
		fi; \
		for leader in $$(cut -d' ' -f2 "$(RUN_RECORD)"); do stop_session "$$leader" || return 1; done; \
		stop_session || return 1; \
		rm -f "$(RUN_RECORD)"; \
		echo "Stopped what make run started: $$stopped processes (Airflow home $(AIRFLOW_HOME))"; \
	}
# Exits 0 when something answers on the port of $(API_REACH).
PORT_TAKEN = import socket, sys; family = socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET; \
	sys.exit(socket.socket(family).connect_ex((sys.argv[1], int(sys.argv[2]))) != 0)

.PHONY: run
run: export AIRFLOW__API__HOST = $(HOST)
run: export AIRFLOW__API__PORT = $(PORT)
run: export AIRFLOW__CORE__EXECUTION_API_SERVER_URL = $(LOCAL_URL)/execution/
run: export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS = $(ALL_ADMINS)
run: export AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION = False
run: export PYTHONUNBUFFERED = 1
run: $(AIRFLOW_HOME)/airflow.db  ## Airflow on 127.0.0.1:8080 (HOST=, PORT=), the DAGs on their schedules, a producer
	@$(SESSION_FUNCTIONS); \
	if [ -n "$$(members)" ]; then \
		echo "make run: already running for $(AIRFLOW_HOME); 'make stop' first" >&2; exit 1; \
	fi; \
	if $(BIN)/python -c '$(PORT_TAKEN)' '$(API_REACH)' '$(PORT)'; then \
		echo "make run: another program listens on port $(PORT); choose a free one: make run PORT=8081" >&2; exit 1; \
	fi; \
	mkdir -p "$(SLUICE_DATA_ROOT)"; \
	unpaused=$$($(BIN)/airflow dags unpause --treat-dag-id-as-regex --yes '.*' --output plain 2>&1) \
		|| { echo "$$unpaused" >&2; exit 1; }; \
	unpaused=$$(echo "$$unpaused" | awk '$$2 == "True" { printf " %s", $$1 }'); \
	[ -z "$$unpaused" ] || echo "Unpaused the DAGs that the metadata database had paused:$$unpaused"; \
	echo "Starting Airflow (scheduler, dag-processor, triggerer, api-server on $(HOST) port $(PORT))"; \
	echo "and the demo producer: a round of events every 60 s into $(SLUICE_DATA_ROOT)/landing"; \
	trap 'echo; stop_sessions; exit 0' INT TERM HUP; \
	$(SPAWN) bash -c '$(SCHEDULING_SESSION)' </dev/null & scheduling=$$!; \
	echo "scheduling $$scheduling $$(started_at $$scheduling)" > "$(RUN_RECORD)"; \
	$(SPAWN) bash -c '$(API_SESSION)' </dev/null & api=$$!; \
	echo "api-server $$api $$(started_at $$api)" >> "$(RUN_RECORD)"; \
	deadline=$$((SECONDS + 300)); \
	until $(BIN)/python -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' \
			'$(LOCAL_URL)/api/v2/monitor/health' 2>/dev/null; do \
		kill -0 $$api 2>/dev/null || break; \
		if [ $$SECONDS -ge $$deadline ]; then echo "make run: no answer from $(LOCAL_URL) in 300 s" >&2; break; fi; \
		sleep 1; \
	done; \
	if kill -0 $$api 2>/dev/null; then \
		echo; \
		echo "Airflow UI and REST API: $(RUN_URL), on $(HOST) port $(PORT)$(if $(ON_LOOPBACK), (this machine only))"; \
		case "$(ALL_ADMINS)" in \
			[Tt]rue|1) echo "Every user is an admin, no login. 'make run HOST=0.0.0.0' serves other machines, with a login" ;; \
			*) echo "Log in as admin; the password is in $(PASSWORDS_FILE)" ;; \
		esac; \
		echo "The ingest DAGs run on their schedules. Ctrl-C, or 'make stop' in another terminal, stops it all"; \
	fi; \
	wait $$scheduling $$api; stop_sessions >/dev/null; echo "make run: Airflow has stopped"

.PHONY: stop
stop:  ## stop exactly what `make run` started: Airflow, its task and Spark processes, the producer
	@$(SESSION_FUNCTIONS); stop_sessions

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
	$(BIN)/mypy include plugins spark_apps

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

# What `make clean` deletes. Each must resolve (symbolic links followed) to a path inside the checkout that is not
# .venv, .git or a folder holding files under version control; otherwise it deletes nothing and says why.
CLEAN_PATHS = "$(SLUICE_DATA_ROOT)" "$(AIRFLOW_HOME)" .pytest_cache .ruff_cache .mypy_cache spark-warehouse

.PHONY: clean
clean:  ## remove data, Airflow home and caches, if they are inside the checkout (keeps .venv)
	@resolve() { $(PYTHON) -c 'import os, sys; print(os.path.realpath(sys.argv[1]))' "$$1"; }; \
	checkout=$$(resolve .) || exit 1; delete=(); refused=; \
	for path in $(CLEAN_PATHS); do \
		resolved=$$(resolve "$$path") || exit 1; \
		case "$$resolved/" in \
			"$$checkout/") refused+=$$'\n'"  $$path: is the checkout itself" ;; \
			"$$checkout/.venv/"*|"$$checkout/.git/"*) refused+=$$'\n'"  $$path: is or is inside $${resolved#$$checkout/}" ;; \
			"$$checkout/"*) \
				if [ -n "$$(git -C "$$checkout" ls-files -- "$$resolved" 2>/dev/null | head -n 1)" ]; then \
					refused+=$$'\n'"  $$path: holds files under version control"; \
				else delete+=("$$resolved"); fi ;; \
			*) refused+=$$'\n'"  $$path: resolves to $$resolved, outside the checkout $$checkout" ;; \
		esac; \
	done; \
	if [ -n "$$refused" ]; then echo "make clean: deleting nothing, because of:$$refused" >&2; exit 1; fi; \
	echo "rm -rf $${delete[*]}"; rm -rf -- "$${delete[@]}"
