#!/usr/bin/env bash
# Entry point of Sluice's Spark image: `master`, `worker`, or any other command.
#
# Spark's JVM asks the OS for the current user's name (Hadoop's login), which fails for a UID without a passwd entry.
# The image creates its user at build time with the UID compose runs it as (build arg SLUICE_UID = AIRFLOW_UID) and
# keeps /etc/passwd read-only, so a container started as another UID stops here with the remedy rather than with a
# NullPointerException from deep inside Hadoop.
set -euo pipefail

require_passwd_entry() {
    if ! whoami >/dev/null 2>&1; then
        echo "spark-entrypoint: UID $(id -u) has no passwd entry in this image, which was built for another UID." \
            "Set AIRFLOW_UID in .env to the UID the containers run as and rebuild: docker compose up --build" >&2
        exit 1
    fi
}

case "${1:-master}" in
    master)
        require_passwd_entry
        # The host and ports come from SPARK_MASTER_HOST, SPARK_MASTER_PORT and SPARK_MASTER_WEBUI_PORT.
        exec spark-class org.apache.spark.deploy.master.Master
        ;;
    worker)
        require_passwd_entry
        # Cores, memory and the work folder come from SPARK_WORKER_CORES, SPARK_WORKER_MEMORY, SPARK_WORKER_DIR.
        exec spark-class org.apache.spark.deploy.worker.Worker "${SPARK_MASTER_URL:?set SPARK_MASTER_URL, e.g. spark://spark-master:7077}"
        ;;
    *)
        exec "$@"
        ;;
esac
