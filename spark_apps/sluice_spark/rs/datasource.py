"""The ``sluice_delta`` Spark Python Data Source: the rs Delta engine's entry point for Spark.

``df.writeStream.format("sluice_delta")`` appends micro-batches to Delta tables (:mod:`sluice_spark.rs.sink`);
``spark.readStream.format("sluice_delta").load(path)`` reads a table's new versions
(:mod:`sluice_spark.rs.source`).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource, DataSourceStreamReader

from sluice.constants import SinkMode
from sluice_spark.rs.sink import DeltaRsStreamWriter
from sluice_spark.targets import TableTarget

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

DATA_SOURCE_NAME = "sluice_delta"


class DeltaRsDataSource(DataSource):
    """``df.writeStream.format("sluice_delta")``. Options: ``targets`` (JSON), ``routeColumn``, ``queryId``,
    ``stream``; ``commitInfo`` (JSON object) is added to every commit's metadata. With ``failedColumn``, a batch whose
    rows name a broken ``fail`` expectation there commits nothing; ``exampleColumn`` is what its error shows.

    ``spark.readStream.format("sluice_delta").load(path)`` reads a table's new versions
    (:mod:`sluice_spark.rs.source`)."""

    @classmethod
    def name(cls) -> str:
        return DATA_SOURCE_NAME

    def schema(self) -> StructType:
        from pyspark.sql.types import StructType

        from sluice_spark.rs.source import change_columns, reads_changes, table_schema

        options = {key.lower(): value for key, value in self.options.items()}
        if not options.get("path"):
            raise ValueError(f"{DATA_SOURCE_NAME} source needs a path: spark.readStream.format(...).load(path)")
        schema = table_schema(options["path"])
        return StructType([*schema.fields, *change_columns()]) if reads_changes(options) else schema

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from sluice_spark.rs.source import DeltaRsStreamReader

        return DeltaRsStreamReader(schema, dict(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DeltaRsStreamWriter:
        options = dict(self.options)
        missing = [key for key in ("targets", "routecolumn", "queryid") if key not in {k.lower() for k in options}]
        if missing:
            raise ValueError(f"{DATA_SOURCE_NAME} sink needs the option(s) {', '.join(missing)}")
        lowered = {key.lower(): value for key, value in options.items()}
        targets = [TableTarget.from_dict(item) for item in json.loads(lowered["targets"])]
        routes = [(target.route, target.flag) for target in targets]
        if len(set(routes)) != len(routes):
            raise ValueError(f"{DATA_SOURCE_NAME} sink: each table needs its own route and flag, got {routes}")
        if any(target.mode is not SinkMode.APPEND for target in targets):
            raise ValueError(f"{DATA_SOURCE_NAME} sink appends; merge and overwrite go through foreachBatch")
        return DeltaRsStreamWriter(
            targets=targets,
            route_column=lowered["routecolumn"],
            app_id=lowered["queryid"],
            stream=lowered.get("stream", ""),
            commit_info=json.loads(lowered.get("commitinfo", "{}")),
            failed_column=lowered.get("failedcolumn"),
            example_column=lowered.get("examplecolumn"),
            new_fields_column=lowered.get("newfieldscolumn"),
            origin_column=lowered.get("origincolumn"),
        )
