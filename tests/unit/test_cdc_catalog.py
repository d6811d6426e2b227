"""mode: cdc and the Debezium envelope in the catalog: accepted as the change-data guide writes them, and each bad
setting refused in one line that names the field."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from sluice.catalog import parse_catalog
from sluice.constants import SinkMode
from sluice.errors import CatalogError
from sluice.kinds.delta import DeltaSink

CUSTOMERS: dict[str, Any] = {
    "name": "customers",
    "schedule": "@hourly",
    "source": {"type": "kafka", "options": {"subscribe": "dbserver.public.customers"}, "envelope": "debezium",
               "envelope_tiebreak": "source.lsn",
               "schema": {"id": "bigint not null", "name": "string", "tier": "string"}},
    "sink": {"path": "silver/customers", "mode": "cdc", "keys": ["id"], "sequence_by": "__sequence",
             "cdc": {"scd_type": 2, "except_columns": ["__op", "__ts_ms"], "track_history_columns": ["tier"],
                     "delete_retention": "3 days"}},
}


def catalog(**changes: Any) -> dict[str, Any]:
    stream = copy.deepcopy(CUSTOMERS)
    for path, value in changes.items():
        *parents, last = path.split("__")
        section = stream
        for parent in parents:
            section = section[parent]
        if value is None:
            section.pop(last)
        else:
            section[last] = value
    return {"version": 1, "streams": [stream]}


def test_the_guides_stream_is_accepted_with_the_envelopes_columns() -> None:
    stream = parse_catalog(catalog()).get("customers")
    assert isinstance(stream.sink, DeltaSink) and stream.sink.mode is SinkMode.CDC
    assert stream.sink.cdc is not None and stream.sink.cdc.delete_retention_seconds == 3 * 86_400
    assert stream.source.schema.names == ["id", "name", "tier", "__op", "__ts_ms", "__sequence"]
    assert set(stream.source.schema.required) == {"id", "__ts_ms", "__sequence"}


@pytest.mark.parametrize(("changes", "fragments"), [
    ({"sink__cdc__scd_type": 3}, ("sink.cdc.scd_type", "at most 2")),
    ({"sink__cdc__track_history_columns": ["nope"]}, ("sink.cdc.track_history_columns", "nope")),
    ({"sink__cdc__scd_type": 1}, ("sink.cdc.track_history_columns", "scd_type 2")),
    ({"sink__cdc__except_columns": ["id"]}, ("sink.cdc.except_columns", "id must be written")),
    ({"sink__cdc__delete_retention": "soon"}, ("sink.cdc.delete_retention",)),
    ({"sink__cdc__delete_when": "nope > 1"}, ("sink.cdc.delete_when", "'nope'")),
    ({"sink__cdc__delete_when": "name"}, ("sink.cdc.delete_when", "not a boolean")),
    ({"sink__cdc__colour": "red"}, ("sink.cdc", "colour")),
    ({"sink__mode": "merge"}, ("sink.cdc", "mode cdc")),
    ({"sink__sequence_by": None}, ("sink.sequence_by",)),
    ({"sink__keys": None}, ("sink.keys",)),
    ({"sink__sequence_by": "name"}, ("sink.sequence_by", "not null")),
    ({"source__envelope": "protobuf"}, ("source.envelope", "debezium")),
    ({"source__envelope_tiebreak": "1x"}, ("source.envelope_tiebreak", "source.lsn")),
    ({"source__envelope_truncate": "maybe"}, ("source.envelope_truncate", "fail, ignore")),
    ({"source__schema": {"id": "bigint not null", "__op": "string"}}, ("source.schema", "reserved")),
    ({"source__envelope": None}, ("source.envelope_tiebreak", "debezium")),
])
def test_a_bad_setting_is_refused_naming_its_field(changes: dict[str, Any], fragments: tuple[str, ...]) -> None:
    with pytest.raises(CatalogError) as caught:
        parse_catalog(catalog(**changes))
    message = str(caught.value)
    assert "\n" not in message and "customers" in message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_a_merge_commits_counts_are_read_from_either_engines_history() -> None:
    """The run log's table_changes come from a MERGE commit's operationMetrics, in delta-spark's names (with
    Sluice's keys in userMetadata) or delta-rs's (in the commit info itself); another operation has none."""
    from sluice.constants import CommitInfo
    from sluice.storage.delta import _batch_commit
    from sluice.storage.runlog import run_row
    from sluice.summary import StreamRunSummary

    meta = {CommitInfo.QUERY: "q", CommitInfo.BATCH: 3, CommitInfo.RECORDS: 10, CommitInfo.VERSIONS_CLOSED: 2}
    jvm = _batch_commit({"version": 7, "operation": "MERGE", "userMetadata": json.dumps(meta), "operationMetrics": {
        "numTargetRowsInserted": "4", "numTargetRowsUpdated": "5", "numTargetRowsDeleted": "1"}})
    rs = _batch_commit({"version": 8, "operation": "MERGE", **meta, "operationMetrics": {
        "num_target_rows_inserted": 4, "num_target_rows_updated": 5, "num_target_rows_deleted": 1}})
    append = _batch_commit({"version": 9, "operation": "WRITE", **meta})
    assert jvm is not None and rs is not None and append is not None
    assert jvm.changes == rs.changes == {"inserted": 4, "updated": 5, "deleted": 1, "versions_closed": 2}
    assert append.changes is None
    row = run_row(StreamRunSummary(stream="customers", run_id="r", table_changes=jvm.changes))
    assert json.loads(row["table_changes"]) == jvm.changes



def test_a_backfill_of_a_cdc_stream_is_planned_and_a_merge_streams_refused() -> None:
    """A backfill re-applies a cdc stream's changes through its cdc writer (their sequence makes that idempotent),
    so its request is accepted in both modes; a merge stream's upserts are still refused, naming the stream."""
    from sluice.constants import BackfillMode
    from sluice.operations.backfill import BackfillError, parse_request

    files = catalog(source={"type": "files", "format": "json", "path": "customers", "envelope": "debezium",
                            "schema": {"id": "bigint not null", "name": "string", "tier": "string"}})
    params = {"stream": "customers", "start": "2026-11-01T00:00:00Z", "end": "2026-11-02T00:00:00Z",
              "select_by": "file_time"}
    for mode in BackfillMode:
        assert parse_request({**params, "mode": mode.value}, parse_catalog(files), run_id="manual__1").mode is mode
    merged = copy.deepcopy(files)
    merged["streams"][0]["source"].pop("envelope")
    merged["streams"][0]["source"]["schema"]["version"] = "bigint not null"
    merged["streams"][0]["sink"] = {"path": "silver/customers", "mode": "merge", "keys": ["id"],
                                    "sequence_by": "version"}
    with pytest.raises(BackfillError, match="stream 'customers' keeps state in its checkpoint, upserts its table"):
        parse_request(params, parse_catalog(merged), run_id="manual__1")
