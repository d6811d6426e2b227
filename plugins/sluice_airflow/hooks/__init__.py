"""Sluice's hooks: where the Airflow layer touches the world, so that operators, sensors and triggers stay thin.

- :class:`SluiceSparkSubmitHook` (:mod:`.spark_submit`): the Spark provider's hook with the resolved jars, a local
  default master, the summary captured from the driver log, a killable process group and secrets kept off the
  command line; it ships the project's code to a cluster's executors (:mod:`.code_archive`);
- :class:`WarmServerHook` (:mod:`.warm`): a run on the deployment's warm server;
- :class:`StorageConnectionHook` and :class:`StreamConnectionsHook` (:mod:`.connections`): the credentials of the
  object store and of the connections the streams' kinds need.
"""

from sluice_airflow.hooks.code_archive import CODE_ARCHIVE_FOLDER, SHIPPED_PACKAGES, CodeArchiveError, project_archive
from sluice_airflow.hooks.connections import StorageConnectionHook, StreamConnectionsHook
from sluice_airflow.hooks.spark_submit import DEFAULT_LOCAL_MASTER, SluiceSparkSubmitHook, default_application
from sluice_airflow.hooks.warm import WarmServerHook, warm_address

__all__ = ["CODE_ARCHIVE_FOLDER", "DEFAULT_LOCAL_MASTER", "SHIPPED_PACKAGES", "CodeArchiveError",
           "SluiceSparkSubmitHook", "StorageConnectionHook", "StreamConnectionsHook", "WarmServerHook",
           "default_application", "project_archive", "warm_address"]
