"""The bases of Sluice's operators: the catalog and the roots every operator takes, and spark-submit of a Sluice
application. The work is in the core (:mod:`sluice.operations`) and the hooks (:mod:`sluice_airflow.hooks`); an
operator turns its parameters into their calls and their outcome into Airflow's."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from sluice.arguments import option_args
from sluice.catalog import DEFAULT_CATALOG
from sluice.connections.storage import DEFAULT_CONNECTION as STORAGE_CONNECTION
from sluice.operations.gate import resolve_roots

if TYPE_CHECKING:
    from sluice.catalog import Catalog
    from sluice.paths import Roots
    from sluice_airflow.hooks import SluiceSparkSubmitHook

DEFAULT_SPARK_CONN_ID = "sluice_spark"


def gate_failure(message: str, *, retry: bool) -> AirflowException:
    """The error of a health gate that stops a run: retried when what stopped it may clear by itself (another run's
    lock, still held after the wait; a check that raised), final otherwise (a checkpoint that needs a repair)."""
    return AirflowException(message) if retry else AirflowFailException(message)


class SluiceOperator(BaseOperator):
    """Base of every Sluice operator: the catalog and the three roots, templated, the same for all of them, so that a
    backfill's plan, its run, a health check and a repair of one DAG run all see the same deployment.

    :param catalog: path of the stream catalog; default ``SLUICE_CATALOG`` or the bundled catalog (templated)
    :param landing_root: root of relative source paths; default from the ``SLUICE_*`` environment (templated)
    :param lake_root: root of relative Delta table paths (templated)
    :param checkpoint_root: root of relative checkpoint paths (templated)
    :param storage_conn_id: Airflow connection (aws, wasb/adls or google_cloud_platform) with the credentials of
        roots on object storage; when it is not defined, the machine's own credentials are used
    """

    template_fields: Sequence[str] = ("catalog", "landing_root", "lake_root", "checkpoint_root")

    def __init__(self, *, catalog: str | None = None, landing_root: str | None = None, lake_root: str | None = None,
                 checkpoint_root: str | None = None, storage_conn_id: str = STORAGE_CONNECTION, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.catalog = catalog
        self.landing_root = landing_root
        self.lake_root = lake_root
        self.checkpoint_root = checkpoint_root
        self.storage_conn_id = storage_conn_id
        self._storage_env: dict[str, str] | None = None

    def storage_environment(self) -> dict[str, str]:
        """The object store's credentials from ``storage_conn_id`` (:class:`StorageConnectionHook`), read once."""
        from sluice.operations.gate import places
        from sluice_airflow.hooks import StorageConnectionHook

        if self._storage_env is None:
            where = places(self.resolved_roots(), self.catalog_path(), self.stream_names())
            self._storage_env = StorageConnectionHook(self.storage_conn_id).environment(where)
        return self._storage_env

    def resolved_roots(self) -> Roots:
        return resolve_roots(self.landing_root, self.lake_root, self.checkpoint_root)

    def stream_names(self) -> list[str] | None:
        """The streams this task reads or writes; None for every stream of the catalog (a backfill's stream is a
        param of its run)."""
        streams = getattr(self, "streams", None)
        stream = getattr(self, "stream", None)
        return list(streams) if streams else [stream] if isinstance(stream, str) else None

    def catalog_path(self) -> str:
        return self.catalog or os.environ.get("SLUICE_CATALOG") or str(DEFAULT_CATALOG)

    def task_run_id(self, context: Any) -> str:
        return f"{self.dag_id}/{context['run_id']}/{self.task_id}"

    def stream_catalog(self) -> Catalog:
        """The catalog, checked against this task's roots (:meth:`Catalog.check_roots`): a refusal fails the task
        without retries, before anything is read or written."""
        from sluice.catalog import load_catalog
        from sluice.errors import CatalogError

        try:
            catalog = load_catalog(self.catalog_path())
            catalog.check_roots(self.resolved_roots())
        except CatalogError as exc:
            raise AirflowFailException(f"catalog refused: {exc}") from None
        # The checks this task makes itself (health, lag, planning) read the store with these credentials too.
        os.environ.update(self.storage_environment())
        return catalog


class SparkAppOperator(SluiceOperator):
    """Base of the operators that spark-submit a Sluice application through :class:`SluiceSparkSubmitHook`: the
    connection (``local[*]`` when it is not defined), the project's interpreter for the driver and the workers, and
    killing the whole process tree on kill. Takes the :class:`SluiceOperator` arguments.

    :param conn_id: Airflow Spark connection; when it is not defined the run uses ``local[*]``
    :param engine: override every stream's Delta engine: ``auto``, ``jvm`` or ``rs``
    :param conf: extra Spark configuration (templated)
    :param env_vars: extra environment for spark-submit (templated)
    :param spark_submit_kwargs: further ``SparkSubmitHook`` arguments (jars, packages, executor sizes, ...)
    """

    template_fields: Sequence[str] = (*SluiceOperator.template_fields, "conf", "env_vars")
    template_fields_renderers = {"conf": "json", "env_vars": "json"}

    def __init__(self, *, conn_id: str = DEFAULT_SPARK_CONN_ID, engine: str | None = None,
                 conf: dict[str, Any] | None = None, env_vars: dict[str, str] | None = None,
                 application: str | None = None, spark_submit_kwargs: dict[str, Any] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.conn_id = conn_id
        self.engine = engine
        self.conf = conf
        self.env_vars = env_vars
        self.application = application
        self.spark_submit_kwargs = spark_submit_kwargs
        self._hook: SluiceSparkSubmitHook | None = None

    def engine_args(self) -> list[str]:
        return option_args({"engine": self.engine or None})

    def spark_env(self) -> dict[str, str]:
        """The project's interpreter for the driver and the Python workers, its bin folder for spark-submit, and
        ``env_vars``."""
        from sluice.operations.jvm import interpreter_env

        return interpreter_env(self.env_vars)

    def secret_env(self) -> dict[str, str]:
        """Environment for spark-submit that holds secrets: it never reaches the command line, a log or XCom. The
        object store's credentials, for the driver and (through its environment) the executors."""
        return dict(self.storage_environment())

    def small_run(self) -> bool:
        """Whether the driver's JVM may take the light JIT (:func:`sluice.operations.jvm.small_run`); a backfill's
        run is not small."""
        return False

    def submit(self, script: str, args: list[str], *, name: str) -> AirflowException | None:
        """spark-submit a Sluice runner, its driver's JVM started for a short run and Spark's own log at WARN
        (:mod:`sluice.operations.jvm`); the provider's failure, if any, is returned for the caller to weigh against
        the summary."""
        from sluice.operations.jvm import driver_java_options, log_options, submit_env
        from sluice_airflow.hooks import SluiceSparkSubmitHook

        options = [*driver_java_options(small=self.small_run()), *log_options()]
        self.log.info("Driver JVM options of this run: %s", " ".join(options) or "none")
        # The process's environment only (as secrets are): env_vars would become --conf arguments on YARN and
        # Kubernetes masters, and the driver runs here in client mode.
        spark_env = self.spark_env()
        secret_env = {**self.secret_env(), **submit_env(options, {**os.environ, **spark_env})}
        self._hook = SluiceSparkSubmitHook(conn_id=self.conn_id, application_args=args, env_vars=spark_env,
                                           secret_env=secret_env, conf=self.conf, name=name,
                                           **dict(self.spark_submit_kwargs or {}))
        return self._hook.run_app(script, application=self.application)

    def on_kill(self) -> None:
        if self._hook is not None:
            self._hook.on_kill()
