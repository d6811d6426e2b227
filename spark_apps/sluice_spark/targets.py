"""The tables a routed micro-batch writes: one :class:`TableTarget` per Delta table, shared by every writer."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sluice.constants import SinkMode

# The routed frame's column that says where a row goes, and its values.
ROUTE_COLUMN = "_sluice_route"
GOOD_ROUTE = 0
DEAD_LETTER_ROUTE = 1


@dataclass(frozen=True)
class TableTarget:
    """One Delta table the sink writes: the rows whose route column equals ``route`` (and, for a fan-out table, whose
    boolean ``flag`` column is true).

    ``columns`` pairs each column of the routed frame with its name in the table. ``mode`` is how a batch reaches
    the table: appended, merged by ``keys`` (the highest ``sequence_by`` wins), or rewritten whole.
    """

    route: int
    path: str
    columns: tuple[tuple[str, str], ...]
    partition_by: tuple[str, ...] = ()
    flag: str | None = None
    mode: SinkMode = SinkMode.APPEND
    keys: tuple[str, ...] = ()
    sequence_by: str | None = None

    def selects(self, route: Any, flag: Any = None) -> Any:
        """The row mask of this table over the Arrow arrays of the route and flag columns."""
        import pyarrow.compute as pc

        mask = pc.equal(route, self.route)
        return mask if self.flag is None else pc.and_(mask, flag)

    @property
    def table_columns(self) -> list[str]:
        return [name for _, name in self.columns]

    def to_dict(self) -> dict[str, Any]:
        return {"route": self.route, "path": self.path, "columns": [list(pair) for pair in self.columns],
                "partition_by": list(self.partition_by), "flag": self.flag, "mode": self.mode.value,
                "keys": list(self.keys), "sequence_by": self.sequence_by}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TableTarget:
        return cls(route=data["route"], path=data["path"],
                   columns=tuple((source, name) for source, name in data["columns"]),
                   partition_by=tuple(data.get("partition_by", ())), flag=data.get("flag"),
                   mode=SinkMode(data.get("mode", SinkMode.APPEND.value)), keys=tuple(data.get("keys", ())),
                   sequence_by=data.get("sequence_by"))


def encode_targets(targets: Sequence[TableTarget]) -> str:
    return json.dumps([target.to_dict() for target in targets])
