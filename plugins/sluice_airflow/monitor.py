"""The lag monitor: every few minutes, observe every stream's lag and keep the observation (``observe``), alert on
status changes (``alert``), and trigger catch-up runs (``catch_up``). Alerting does not hold up catch-up runs."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowException

from sluice.catalog import load_catalog
from sluice.constants import AlertChannel
from sluice_airflow.dag_factory import sluice_dag
from sluice_airflow.notifiers import DEFAULT_WEBHOOK_CONN_ID, WebhookNotifier
from sluice_airflow.operators import SluiceOperator

if TYPE_CHECKING:
    from airflow.sdk import BaseNotifier, Context

    from sluice.lag.alerting import Alert
    from sluice.lag.observe import LagReport
    from sluice.lag.store import LagStore
    from sluice.model.stream import StreamSpec

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


class LagMonitorOperator(SluiceOperator):
    """Observe every stream's lag (``sluice.lag``), record it in the lag history, and log each status. A stream
    whose lag cannot be measured is an ERROR, and the others are still observed. The reports go to the XCom key
    ``reports`` (for :class:`LagAlertOperator`).

    Returns the DAG ids to catch up: streams with ``alerts.catch_up`` that are CRITICAL or STOPPED and whose DAG
    has no queued or running run.

    :param catalog: catalog path; default ``SLUICE_CATALOG`` or the bundled catalog (templated)
    :param landing_root: as for the other Sluice operators (templated)
    :param lake_root: (templated)
    :param checkpoint_root: (templated)
    """

    ui_color = "#e8f0d9"

    def execute(self, context: Context) -> list[str]:
        from sluice.lag.alerting import monitor_tick
        from sluice.lag.observe import LagStatus
        from sluice.lag.store import LagStore

        catalog = self.stream_catalog()  # with the object store's credentials, when a root is on one
        roots = self.resolved_roots()
        reports = monitor_tick(catalog, roots, LagStore.for_roots(roots))
        catch_up: list[str] = []
        for report in reports:
            level = self.log.info if report.status is LagStatus.OK else self.log.warning
            level("%s", report.describe())
            if catalog.get(report.stream).alerts.catch_up and report.status in (LagStatus.CRITICAL,
                                                                                LagStatus.STOPPED):
                dag_id = catalog.get(report.stream).dag_id
                if context["ti"].get_dr_count(dag_id=dag_id, states=ACTIVE_RUN_STATES):
                    self.log.info("%s has a run queued or running; no catch-up run", dag_id)
                else:
                    catch_up.append(dag_id)
        context["ti"].xcom_push(key="reports", value=[report.to_dict() for report in reports])
        return catch_up


class LagAlertOperator(SluiceOperator):
    """Send the alerts of the lag reports that ``observe_task_id`` pushed: to the task log always, to a JSON webhook
    when its connection exists, and by email to each stream's ``alerts.email_to`` through the SMTP provider.
    Each channel keeps its own alert state (``sluice.lag.alerting.decide``): no repeats, escalation, resolve. A failed
    delivery fails the task; that channel sends the alert again on the next run, and the others do not repeat it.

    :param observe_task_id: the :class:`LagMonitorOperator` task
    :param catalog: catalog path; default ``SLUICE_CATALOG`` or the bundled catalog (templated)
    :param webhook_conn_id: HTTP connection of the webhook; no webhook when it is not defined
    :param smtp_conn_id: SMTP connection for email alerts
    :param email_from: sender address; default the SMTP connection's ``from_email``
    :param repeat_after_seconds: remind about an unchanged non-OK status this often; default never
    """

    ui_color = "#f4e4c1"

    def __init__(self, *, observe_task_id: str, webhook_conn_id: str | None = DEFAULT_WEBHOOK_CONN_ID,
                 smtp_conn_id: str = "smtp_default", email_from: str | None = None,
                 repeat_after_seconds: float | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.observe_task_id = observe_task_id
        self.webhook_conn_id = webhook_conn_id
        self.smtp_conn_id = smtp_conn_id
        self.email_from = email_from
        self.repeat_after_seconds = repeat_after_seconds

    def channels(self, stream: StreamSpec, *, webhook: bool) -> list[AlertChannel]:
        return [AlertChannel.LOG, *([AlertChannel.WEBHOOK] if webhook else []),
                *([AlertChannel.EMAIL] if stream.alerts.email_to else [])]

    def notifier(self, channel: AlertChannel, alert: Alert, stream: StreamSpec) -> BaseNotifier | None:
        """The notifier that sends an alert on a channel; none for the log (the task logs the alert itself)."""
        if channel is AlertChannel.WEBHOOK:
            return WebhookNotifier(payload=alert.payload(), conn_id=self.webhook_conn_id or "")
        if channel is AlertChannel.EMAIL:
            from html import escape

            from airflow.providers.smtp.notifications.smtp import SmtpNotifier

            return SmtpNotifier(to=list(stream.alerts.email_to), from_email=self.email_from, subject=alert.title,
                                html_content=f"<pre>{escape(alert.text())}</pre>", smtp_conn_id=self.smtp_conn_id)
        return None

    def execute(self, context: Context) -> list[dict[str, str]]:
        from sluice.lag.observe import LagReport
        from sluice.lag.store import LagStore

        catalog = load_catalog(self.catalog)
        store = LagStore.for_roots(self.resolved_roots())
        webhook = _connection_exists(self.webhook_conn_id)
        if not webhook:
            self.log.info("No connection %r: alerts go to the log and to email only", self.webhook_conn_id)
        reports = context["ti"].xcom_pull(task_ids=self.observe_task_id, key="reports") or []
        sent: list[dict[str, str]] = []
        failures: list[str] = []
        for report in map(LagReport.from_dict, reports):
            self._alert(context, report, catalog.get(report.stream), store, webhook=webhook, sent=sent,
                        failures=failures)
        if failures:
            raise AirflowException(f"alert delivery failed ({'; '.join(failures)}); these are sent again on the "
                                   "next run")
        return sent

    def _alert(self, context: Context, report: LagReport, stream: StreamSpec, store: LagStore, *, webhook: bool,
               sent: list[dict[str, str]], failures: list[str]) -> None:
        """Decide and send the alerts of one stream's report on each of its channels; what was sent goes to
        ``sent``, what could not be to ``failures`` (its state is not saved, so the next run sends it again)."""
        from sluice.lag.alerting import decide

        ok_streak = store.ok_streak(stream.name, limit=stream.alerts.resolve_after_observations)
        for channel in self.channels(stream, webhook=webhook):
            alert, state = decide(store.alert_state(stream.name, channel), report, channel=channel,
                                  repeat_after_seconds=self.repeat_after_seconds, ok_streak=ok_streak,
                                  resolve_after=stream.alerts.resolve_after_observations)
            if alert is not None:
                notifier = self.notifier(channel, alert, stream)
                try:
                    if notifier is None:
                        self.log.warning("ALERT %s\n%s", alert.kind.value, alert.text())
                    else:
                        notifier.notify(context)
                except Exception as exc:
                    self.log.error("Could not send the %s alert of %s by %s: %s", alert.kind.value, stream.name,
                                   channel, exc)
                    failures.append(f"{stream.name} by {channel}: {exc}")
                    continue
                sent.append({"stream": stream.name, "channel": channel, "kind": alert.kind.value,
                             "status": alert.status.value})
            if state is not None:
                store.save_alert_state(state)


def lag_monitor_dag(*, doc: str = "", schedule: str = "*/5 * * * *") -> DAG:
    """Observe and alert every few minutes; trigger catch-up runs where the catalog asks for them. The catalog is
    read when the task runs, so a new stream is monitored without a DAG change."""
    from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator

    with sluice_dag(
        "lag_monitor",
        description="Lag of every stream (no JVM), its history, and alerts without repeats",
        schedule=schedule,
        tags=["monitoring"],
        doc=doc,
        retry_delay=timedelta(seconds=30),
    ) as dag:
        observe = LagMonitorOperator(task_id="observe", execution_timeout=timedelta(minutes=4))
        alert = LagAlertOperator(task_id="alert", observe_task_id=observe.task_id,
                                 execution_timeout=timedelta(minutes=2))
        catch_up = TriggerDagRunOperator.partial(task_id="catch_up", conf={"reason": "lag_monitor catch-up"}).expand(
            trigger_dag_id=observe.output)
        observe >> [alert, catch_up]
    return dag
