"""The nightly maintenance of a stream's Delta tables, or of the run log's."""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowFailException

from sluice_airflow.operators.base import SluiceOperator

if TYPE_CHECKING:
    from airflow.sdk import Context


class DeltaMaintenanceOperator(SluiceOperator):
    """Compact, vacuum, checkpoint and clean the Delta tables of one stream while holding its lock, or the run log's
    tables when ``stream`` is None (see ``sluice.operations.maintenance``). The DAG run's params choose the streams
    (``streams``: empty for all), the vacuum retention (``vacuum_retention_hours``: at least each table's own) and
    ``dry_run``. A stream the params leave out is skipped. The report of each table is the XCom return value. Takes
    the :class:`SluiceOperator` arguments.

    :param stream: catalog stream name, or None for the run log
    :param lock_wait_seconds: how long to wait for a running stream to release its lock
    """

    ui_color = "#dff0d8"

    def __init__(self, *, stream: str | None, lock_wait_seconds: float = 600, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stream = stream
        self.lock_wait_seconds = lock_wait_seconds

    def execute(self, context: Context) -> list[dict[str, Any]]:
        from sluice.errors import SluiceError
        from sluice.operations.maintenance import maintain_run_log, maintain_stream

        params = context["params"]
        retention = params.get("vacuum_retention_hours")
        dry_run = bool(params.get("dry_run", False))
        catalog = self.stream_catalog()
        self._skip_unless_chosen(list(params.get("streams") or []), catalog.streams)
        roots, run_id = self.resolved_roots(), self.task_run_id(context)
        try:
            if self.stream is None:
                reports = maintain_run_log(roots, run_id=run_id, vacuum_retention_hours=retention, dry_run=dry_run)
            else:
                reports = maintain_stream(catalog.get(self.stream), catalog, roots, run_id=run_id, dry_run=dry_run,
                                          vacuum_retention_hours=retention, lock_wait_seconds=self.lock_wait_seconds)
        except SluiceError as exc:
            raise AirflowFailException(f"maintenance refused: {exc}") from exc
        for report in reports:
            self.log.info("%s (%s): version %s -> %s, files %d -> %d (compacted %d into %d), vacuumed %d, "
                          "checkpoint at %s%s", report.table, report.role, report.version_before,
                          report.version_after, report.files_before, report.files_after,
                          report.compacted_files_removed, report.compacted_files_added, report.vacuumed_files,
                          report.checkpoint_version, "".join(f"; {note}" for note in report.skipped))
        return [report.to_dict() for report in reports]

    def _skip_unless_chosen(self, chosen: list[str], known: Collection[str]) -> None:
        """Refuse params' streams the catalog does not know; skip this task when the params leave its stream out
        (the run log is maintained only when every stream is)."""
        from airflow.sdk.exceptions import AirflowSkipException

        unknown = [name for name in chosen if name not in known]
        if unknown:
            raise AirflowFailException(f"streams: {', '.join(map(repr, unknown))} not in the catalog")
        if self.stream is not None and chosen and self.stream not in chosen:
            raise AirflowSkipException(f"stream {self.stream} is not among the params' streams")
        if self.stream is None and chosen:
            raise AirflowSkipException("the run log is maintained when every stream is")
