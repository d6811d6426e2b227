# Sluice's Spark image, for the standalone master and workers. Built from the repository root by docker-compose.yaml.
#
# Executors run Sluice's Python code (the delta-rs sink's writers and Sluice's Python data sources) with the
# interpreter the driver names (PYSPARK_PYTHON=python3, found on PATH). PySpark refuses a driver and workers on two
# Python minor versions, and the workers unpickle classes of sluice_spark, so this image has the Airflow image's
# Python minor version, the same requirements.txt and the project at the same path (/opt/sluice).
# It is built on python:*-slim rather than apache/spark, whose Python is the distribution's, not the Airflow image's.
# Pinned by digest, like every image of the stack; the tag says which Python it is. Python 3.12 because the
# Airflow image is apache/airflow:3.3.2-python3.12 (see airflow.Dockerfile).
FROM python:3.12-slim-bookworm@sha256:782412e85d0f0984994c290652577d4018aff08145c85b262bb63dc0c7522254

# procps gives Spark's launch scripts `ps`; see airflow.Dockerfile for man1.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/*

# The stack runs as AIRFLOW_UID with group 0, as the Airflow image does, so that the driver and the executors write
# the shared data as one owner. Spark's JVM needs a passwd entry for its UID (Hadoop's login asks for the user's
# name), so the user is created here, at build time, with the UID compose passes (SLUICE_UID = AIRFLOW_UID);
# /etc/passwd stays root's and read-only. Change AIRFLOW_UID, rebuild (`docker compose up --build`).
ARG SLUICE_UID=50000
RUN if ! getent passwd "${SLUICE_UID}" >/dev/null; then \
        useradd --uid "${SLUICE_UID}" --gid 0 --create-home --home-dir /home/sluice --shell /usr/sbin/nologin sluice; \
    fi \
    && mkdir -p /opt/sluice/data /opt/spark/work /opt/spark/conf \
    && chown -R "${SLUICE_UID}:0" /opt/sluice /opt/spark/work \
    && chmod -R g+rwX /opt/sluice /opt/spark/work
# Root's and read-only: spark.ui.killEnabled=false for the master, the workers and anything started here.
COPY include/docker/spark-defaults.conf /opt/spark/conf/spark-defaults.conf

COPY requirements.txt /opt/sluice/requirements.txt
RUN pip install --no-cache-dir -r /opt/sluice/requirements.txt

# No JVM jars here: the driver (in the Airflow image) gives every application Sluice's jars as spark.jars, and the
# executors fetch them from it.
COPY --chown=${SLUICE_UID}:0 . /opt/sluice
RUN pip install --no-cache-dir --no-deps -e /opt/sluice
# Bytecode in the PySpark zip that Spark puts first on the executors' Python workers' path (docs/performance/cost.md).
RUN python -m sluice pyspark-bytecode || echo "no bytecode in PySpark's zip: Spark's Python processes compile it"

ENV SPARK_WORKER_DIR=/opt/spark/work \
    SPARK_CONF_DIR=/opt/spark/conf \
    PYSPARK_PYTHON=python3
USER ${SLUICE_UID}:0
WORKDIR /opt/sluice
ENTRYPOINT ["bash", "/opt/sluice/include/docker/spark-entrypoint.sh"]
CMD ["master"]
