"""``source.notifications`` without a queue: the catalog's refusals, reading S3 event notifications, the glob a
notified run gives Spark, and which notified files a run takes (the journal against the source log)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sluice.catalog import parse_catalog
from sluice.errors import CatalogError
from sluice.storage.notified import notified_glob, s3_objects
from tests.helpers import events_stream


def catalog(**source: Any) -> dict[str, Any]:
    return {"version": 1, "streams": [events_stream(source={**events_stream()["source"], **source})]}


def refusal(raw: dict[str, Any]) -> str:
    with pytest.raises(CatalogError) as caught:
        parse_catalog(raw)
    return str(caught.value)


def test_notifications_are_read_with_their_default() -> None:
    spec = parse_catalog(catalog(path="s3a://landing/events", notifications={"queue": "events"})) \
        .get("events").source.notifications
    assert (spec.queue, spec.list_every_seconds) == ("events", 86_400)


@pytest.mark.parametrize("path", ["events", "/data/landing/events", "s3://landing/events", "abfss://c@a/events"])
def test_notifications_need_an_s3a_folder(path: str) -> None:
    message = refusal(catalog(path=path, notifications={"queue": "events"}))
    assert "source.notifications:" in message and "s3a://bucket/folder" in message and path in message


@pytest.mark.parametrize(("notifications", "field"), [
    ({}, "source.notifications.queue: is required"),
    ({"queue": " "}, "source.notifications.queue: is empty"),
    ({"queue": "q", "list_every": "never"}, "source.notifications.list_every:"),
    ({"queue": "q", "poll": "1 minute"}, "source.notifications: unknown key(s) poll"),
    ({"queue": "q", "connection": "no such id!"}, "source.notifications.connection: expected an Airflow connection"),
    ("events", "source.notifications: expected a mapping"),
])
def test_bad_notifications(notifications: Any, field: str) -> None:
    assert field in refusal(catalog(path="s3a://landing/events", notifications=notifications))


def test_other_source_kinds_refuse_notifications_by_name() -> None:
    kafka = {"name": "clicks", "source": {
        "type": "kafka", "format": "json", "schema": {"id": "string"},
        "options": {"subscribe": "clicks", "startingOffsets": "earliest"}, "notifications": {"queue": "q"}},
        "sink": {"path": "bronze/clicks", "engine": "rs"}, "schedule": "*/5 * * * *"}
    assert "unknown key(s) notifications" in refusal({"version": 1, "streams": [kafka]})


def _event(bucket: str, *keys: str, name: str = "ObjectCreated:Put") -> str:
    return json.dumps({"Records": [{"eventSource": "aws:s3", "eventName": name,
                                    "s3": {"bucket": {"name": bucket}, "object": {"key": key, "size": 1}}}
                                   for key in keys]})


def test_s3_events_are_read_with_form_encoded_keys() -> None:
    assert s3_objects(_event("b", "in/a+b%2Bc.json", "in/x.json")) == [("b", "in/a b+c.json"), ("b", "in/x.json")]
    assert s3_objects(_event("b", "in/a.json", name="ObjectRemoved:Delete")) == []
    assert s3_objects(json.dumps({"Service": "Amazon S3", "Event": "s3:TestEvent", "Bucket": "b"})) == []
    through_sns = json.dumps({"Type": "Notification", "Message": _event("b", "in/a.json")})
    assert s3_objects(through_sns) == [("b", "in/a.json")]


_NO_KEY = {"Records": [{"eventSource": "aws:s3", "eventName": "ObjectCreated:Put"}]}


@pytest.mark.parametrize("body", ["not json", "[1]", json.dumps({"Records": "x"}),
                                  json.dumps({"Records": [{"eventSource": "aws:sqs"}]}), json.dumps(_NO_KEY)])
def test_a_message_that_is_no_s3_event_is_none(body: str) -> None:
    assert s3_objects(body) is None


def test_the_glob_names_each_file_below_the_bucket() -> None:
    # Each alternative holds a slash, so Hadoop expands the braces into one plain path per file before it matches.
    assert notified_glob(["s3a://b/in/x=1/b.json", "s3a://b/in/a b.json"]) == "s3a://b/{in/a b.json,in/x=1/b.json}"


def test_the_glob_refuses_files_at_a_bucket_root_or_of_two_buckets() -> None:
    with pytest.raises(Exception, match="below a folder of one bucket"):
        notified_glob(["s3a://b/a.json"])
    with pytest.raises(Exception, match="below a folder of one bucket"):
        notified_glob(["s3a://b/in/a.json", "s3a://c/in/b.json"])


def test_the_hadoop_glob_matches_exactly_the_files(tmp_path: Path) -> None:
    """The same expansion Hadoop makes: braces holding a slash become one pattern each (GlobExpander), which the
    listing rule of a notified file then matches by name."""
    from sluice.storage.landing import glob_regex

    pattern = notified_glob(["s3a://b/in/a b.json", "s3a://b/in/x=1/b.json"])
    alternatives = pattern.split("{", 1)[1].rstrip("}").split(",")
    assert [glob_regex(alternative).match(alternative) is not None for alternative in alternatives] == [True, True]
