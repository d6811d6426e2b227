"""The lag monitor: every few minutes, observe every stream's lag, keep the observation, and alert on changes."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import DAG, BaseOperator
from airflow.sdk.exceptions import AirflowException

from sluice.catalog import load_catalog
from sluice_airflow.dag_factory import START_DATE
from sluice_airflow.notifiers import DEFAULT_WEBHOOK_CONN_ID, WebhookNotifier
from sluice_airflow.operators import resolve_roots

if TYPE_CHECKING:
    from airflow.sdk import BaseNotifier, Context

    from sluice.alerting import Alert
    from sluice.catalog import StreamSpec

ACTIVE_RUN_STATES = ["queued", "running"]


def _connection_exists(conn_id: str | None) -> bool:
    if not conn_id:
        return False
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return False
    return True


class LagMonitorOperator(BaseOperator):
    """Observe every stream's lag (``sluice.lag``), record it in the lag history, and send an alert when a status
    changes: to the task log always, to a JSON webhook when its connection exists, and by email to the stream's
    ``alerts.email_to`` through the SMTP provider. Repeats are suppressed; a worse status escalates; the return to
    OK resolves (``sluice.alerting``). A failed delivery fails the task and is tried again on the next run.

    Returns the DAG ids to catch up: streams with ``alerts.catch_up`` that are CRITICAL or STOPPED and whose DAG
    has no queued or running run.

    :param catalog: catalog path; default ``SLUICE_CATALOG`` or the bundled catalog (templated)
    :param webhook_conn_id: HTTP connection of the webhook; no webhook when it is not defined
    :param smtp_conn_id: SMTP connection for email alerts
    :param email_from: sender address; default the SMTP connection's ``from_email``
    :param repeat_after_seconds: remind about an unchanged non-OK status this often; default never
    :param landing_root: as for the other Sluice operators (templated)
    :param lake_root: (templated)
    :param checkpoint_root: (templated)
    """

    template_fields: Sequence[str] = ("catalog", "landing_root", "lake_root", "checkpoint_root")
    ui_color = "#e8f0d9"

    def __init__(self, *, catalog: str | None = None, webhook_conn_id: str | None = DEFAULT_WEBHOOK_CONN_ID,
                 smtp_conn_id: str = "smtp_default", email_from: str | None = None,
                 repeat_after_seconds: float | None = None, landing_root: str | None = None,
                 lake_root: str | None = None, checkpoint_root: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.catalog = catalog
        self.webhook_conn_id = webhook_conn_id
        self.smtp_conn_id = smtp_conn_id
        self.email_from = email_from
        self.repeat_after_seconds = repeat_after_seconds
        self.landing_root = landing_root
        self.lake_root = lake_root
        self.checkpoint_root = checkpoint_root

    def notifiers(self, alert: Alert, stream: StreamSpec, *, webhook: bool) -> dict[str, BaseNotifier]:
        channels: dict[str, BaseNotifier] = {}
        if webhook:
            channels["webhook"] = WebhookNotifier(payload=alert.payload(), conn_id=self.webhook_conn_id or "")
        if stream.alerts.email_to:
            from html import escape

            from airflow.providers.smtp.notifications.smtp import SmtpNotifier

            channels["email"] = SmtpNotifier(to=list(stream.alerts.email_to), from_email=self.email_from,
                                             subject=alert.title, html_content=f"<pre>{escape(alert.text())}</pre>",
                                             smtp_conn_id=self.smtp_conn_id)
        return channels

    def execute(self, context: Context) -> list[str]:
        from sluice.alerting import monitor_tick
        from sluice.lag import LagStatus
        from sluice.lag_store import LagStore

        catalog = load_catalog(self.catalog)
        roots = resolve_roots(self.landing_root, self.lake_root, self.checkpoint_root)
        store = LagStore.for_roots(roots)
        webhook = _connection_exists(self.webhook_conn_id)
        if not webhook:
            self.log.info("No connection %r: alerts go to the log and to email only", self.webhook_conn_id)
        failures: list[str] = []
        catch_up: list[str] = []
        for tick in monitor_tick(catalog, roots, store, repeat_after_seconds=self.repeat_after_seconds):
            stream = catalog.get(tick.report.stream)
            level = self.log.info if tick.report.status is LagStatus.OK else self.log.warning
            level("%s", tick.report.describe())
            if tick.alert is not None:
                self.log.warning("ALERT %s\n%s", tick.alert.kind.value, tick.alert.text())
                failed = self._deliver(tick.alert, stream, context, webhook=webhook)
                failures += failed
                if not failed and tick.state is not None:
                    store.save_alert_state(tick.state)
            if stream.alerts.catch_up and tick.report.status in (LagStatus.CRITICAL, LagStatus.STOPPED):
                dag_id = f"ingest_{stream.name}"
                if context["ti"].get_dr_count(dag_id=dag_id, states=ACTIVE_RUN_STATES):
                    self.log.info("%s has a run in progress; no catch-up run", dag_id)
                else:
                    catch_up.append(dag_id)
        if failures:
            raise AirflowException(f"alert delivery failed ({'; '.join(failures)}); the alerts are sent again on "
                                   "the next run")
        return catch_up

    def _deliver(self, alert: Alert, stream: StreamSpec, context: Context, *, webhook: bool) -> list[str]:
        failed = []
        for channel, notifier in self.notifiers(alert, stream, webhook=webhook).items():
            try:
                notifier.notify(context)
            except Exception as exc:
                self.log.error("Could not send the %s alert of %s by %s: %s", alert.kind.value, stream.name,
                               channel, exc)
                failed.append(f"{stream.name} by {channel}: {exc}")
        return failed


def lag_monitor_dag(*, doc: str = "", schedule: str = "*/5 * * * *") -> DAG:
    """Observe and alert every few minutes; trigger catch-up runs where the catalog asks for them. The catalog is
    read when the task runs, so a new stream is monitored without a DAG change."""
    from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator

    with DAG(
        dag_id="lag_monitor",
        description="Lag of every stream (no JVM), its history, and alerts without repeats",
        schedule=schedule,
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        default_args={"owner": "data-eng", "retries": 1, "retry_delay": timedelta(seconds=30)},
        tags=["sluice", "monitoring"],
        doc_md=doc,
    ) as dag:
        observe = LagMonitorOperator(task_id="observe_and_alert", execution_timeout=timedelta(minutes=4))
        TriggerDagRunOperator.partial(task_id="catch_up", conf={"reason": "lag_monitor catch-up"}).expand(
            trigger_dag_id=observe.output)
    return dag
