# Sluice's Airflow image, for every Airflow service and for the demo producers. Built from the repository root by
# docker-compose.yaml.
#
# The LocalExecutor runs tasks in the scheduler's container, and spark-submit runs in client mode, so the Spark
# driver lives here too. That is why the image has Java, the same Python minor version and pyspark as the
# Spark image (include/docker/spark.Dockerfile), and the project installed at the same path (/opt/sluice).
#
# Pinned by digest, like every image of the stack. The tag is the apache-airflow pin of requirements.txt on Python
# 3.12: no digest of the python3.11 variant could be confirmed when the pins were set (docs/guides/production-stack.md, "Images").
FROM apache/airflow:3.3.2-python3.12@sha256:9df9c8be4096b9cc626bd7cb1f2b8c712eef66c59c615f8c7e6200871ca10bd1

USER root
# The JRE's post-install links its man pages into /usr/share/man/man1, which slim Debian images leave out.
# procps gives Spark's launch scripts `ps`.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps maven openjdk-17-jdk-headless \
    && apt-get autoremove -yqq --purge \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /opt/sluice/data \
    && chown -R airflow:0 /opt/sluice

# The containers run as AIRFLOW_UID with group 0. The base image makes /etc/passwd writable by group 0 so that its
# entrypoint can add an entry for an unknown UID at run time, which also lets any process of the container rewrite
# the entries (root's included). Sluice's stack knows its UID at build time (compose passes SLUICE_UID = AIRFLOW_UID):
# the entry is made here, for the Spark driver that runs in the scheduler (Hadoop's login needs the user's name), and
# /etc/passwd goes back to root-only writes. SLUICE_UID rather than AIRFLOW_UID: the base image's ENV AIRFLOW_UID
# would override an ARG of that name.
ARG SLUICE_UID=50000
RUN if ! getent passwd "${SLUICE_UID}" >/dev/null; then \
        useradd --uid "${SLUICE_UID}" --gid 0 --no-create-home --home-dir /home/airflow --shell /usr/sbin/nologin \
            sluice; \
    fi \
    && chmod go-w /etc/passwd /etc/group
# Root's and read-only: spark.ui.killEnabled=false for every application the scheduler submits (client mode).
COPY include/docker/spark-defaults.conf /opt/spark/conf/spark-defaults.conf
ENV SPARK_CONF_DIR=/opt/spark/conf
USER airflow

# The runtime pins Sluice is tested with (requirements-dev.txt, the tools of tests, lint and docs, stays out). They
# pin the same apache-airflow as the base image, so pip keeps Airflow.
COPY --chown=airflow:0 requirements.txt /opt/sluice/requirements.txt
RUN pip install --no-cache-dir -r /opt/sluice/requirements.txt

# The project last, so that a code change rebuilds only this layer. Editable, like `make venv`: the operators find
# spark_apps/stream_runner.py and backfill_runner.py beside the sluice_spark package.
COPY --chown=airflow:0 . /opt/sluice
RUN pip install --no-cache-dir --no-deps -e /opt/sluice
# The JVM jars of include/jvm/pom.xml (delta-spark, Spark's Kafka connector, Hadoop's s3a, abfss and gs connectors),
# resolved by Maven as `make venv` does, with the object-store profile on top; every application the scheduler
# submits gets them as spark.jars, and the executors fetch them from the driver. Maven is removed again below.
ENV SLUICE_JARS_DIR=/opt/sluice/jars
RUN python -m sluice jars --with object-stores && rm -rf /home/airflow/.m2
# Sluice's own JVM classes (include/jvm/drift: the JSON drift check, the session extension), compiled beside them; the
# JDK goes with Maven.
RUN python -m sluice jvm-classes
# Bytecode in the PySpark zip that Spark puts first on its Python processes' path (docs/performance/cost.md); without it, each
# of those processes compiles PySpark as it starts.
RUN python -m sluice pyspark-bytecode || echo "no bytecode in PySpark's zip: Spark's Python processes compile it"

# Maven and the JDK were for the jars only.
USER root
RUN apt-get purge -y maven openjdk-17-jdk-headless && apt-get autoremove -yqq --purge && apt-get clean && rm -rf /var/lib/apt/lists/*
USER airflow
