#!/usr/bin/env bash
# Entry point of Sluice's Spark image: `master`, `worker`, or any other command.
#
# Spark's JVM asks the OS for the current user's name (Hadoop's login). A UID without a passwd entry makes that
# fail, so one is added for it, as Spark's own image does; the image leaves /etc/passwd writable by group 0.
set -euo pipefail

if ! whoami >/dev/null 2>&1 && [ -w /etc/passwd ]; then
    echo "sluice:x:$(id -u):$(id -g):sluice:${HOME:-/tmp}:/usr/sbin/nologin" >> /etc/passwd
fi

case "${1:-master}" in
    master)
        # The host and ports come from SPARK_MASTER_HOST, SPARK_MASTER_PORT and SPARK_MASTER_WEBUI_PORT.
        exec spark-class org.apache.spark.deploy.master.Master
        ;;
    worker)
        # Cores, memory and the work folder come from SPARK_WORKER_CORES, SPARK_WORKER_MEMORY, SPARK_WORKER_DIR.
        exec spark-class org.apache.spark.deploy.worker.Worker "${SPARK_MASTER_URL:?set SPARK_MASTER_URL, e.g. spark://spark-master:7077}"
        ;;
    *)
        exec "$@"
        ;;
esac
