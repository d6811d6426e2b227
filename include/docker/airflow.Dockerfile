# Sluice's Airflow image, for every Airflow service and for the demo producers. Built from the repository root by
# docker-compose.yaml.
#
# The LocalExecutor runs tasks in the scheduler's container, and spark-submit runs in client mode, so the Spark
# driver lives here too. That is why the image has Java, the same Python minor version, pyspark and jars as the
# Spark image (include/docker/spark.Dockerfile), and the project installed at the same path (/opt/sluice).
#
# Pinned by digest, like every image of the stack. The tag is the apache-airflow pin of requirements.txt on Python
# 3.12: no digest of the python3.11 variant could be confirmed when the pins were set (README: "Images").
FROM apache/airflow:3.3.2-python3.12@sha256:9df9c8be4096b9cc626bd7cb1f2b8c712eef66c59c615f8c7e6200871ca10bd1

USER root
# The JRE's post-install links its man pages into /usr/share/man/man1, which slim Debian images leave out.
# procps gives Spark's launch scripts `ps`.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
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

# The pinned set Sluice is tested with. It pins the same apache-airflow as the base image, so pip keeps Airflow.
COPY --chown=airflow:0 requirements.txt /opt/sluice/requirements.txt
RUN pip install --no-cache-dir -r /opt/sluice/requirements.txt

# Jar versions: SPARK_VERSION and DELTA_VERSION must equal the pyspark and delta-spark pins of requirements.txt (the
# script refuses otherwise); KAFKA_CLIENTS_VERSION and COMMONS_POOL2_VERSION follow Spark's own build. Keep these
# ARGs equal in both Dockerfiles.
ARG SPARK_VERSION=4.2.0
ARG DELTA_VERSION=4.4.1
ARG KAFKA_CLIENTS_VERSION=3.9.2
ARG COMMONS_POOL2_VERSION=2.12.1
# Object-store connectors (s3a, abfss, gs): HADOOP_VERSION must be pyspark's hadoop-client (checked);
# AWS_SDK_VERSION the bundle that hadoop-aws of that Hadoop declares (hadoop-project's aws-java-sdk-v2.version).
ARG HADOOP_VERSION=3.5.0
ARG AWS_SDK_VERSION=2.29.52
ARG GCS_CONNECTOR_VERSION=3.1.3
ARG MAVEN_REPOSITORY=https://repo1.maven.org/maven2
COPY --chown=airflow:0 include/docker/fetch_spark_jars.py /opt/sluice/include/docker/fetch_spark_jars.py
RUN python /opt/sluice/include/docker/fetch_spark_jars.py --spark "${SPARK_VERSION}" --delta "${DELTA_VERSION}" \
        --kafka-clients "${KAFKA_CLIENTS_VERSION}" --commons-pool2 "${COMMONS_POOL2_VERSION}" \
        --hadoop "${HADOOP_VERSION}" --aws-sdk "${AWS_SDK_VERSION}" --gcs-connector "${GCS_CONNECTOR_VERSION}" \
        --repository "${MAVEN_REPOSITORY}"

# The project last, so that a code change rebuilds only this layer. Editable, like `make venv`: the operators find
# spark_apps/stream_runner.py and backfill_runner.py beside the sluice_spark package.
COPY --chown=airflow:0 . /opt/sluice
RUN pip install --no-cache-dir --no-deps -e /opt/sluice
# Bytecode in the PySpark zip that Spark puts first on its Python processes' path (README, "Cost"); without it, each
# of those processes compiles PySpark as it starts.
RUN python -m sluice pyspark-bytecode || echo "no bytecode in PySpark's zip: Spark's Python processes compile it"
