"""Read a stream's transform and its expectations, and check both against the columns they see.

The transform is the name of a Python transform (:mod:`sluice.model.transforms`) or ``{sql: "SELECT ... FROM
source"}``; its input is what the source reads (the declared columns and the source's lineage columns), its output
is what the rules, the patterns and the sink see. Expectations are checked against that output.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from sluice.constants import RESCUED_COLUMN
from sluice.model.expectations import Expectation, NullResult, Violation
from sluice.model.section import Section
from sluice.model.sources import SourceSpec
from sluice.model.sql import Columns, SqlError, SqlTransform, check_expression, parse_transform
from sluice.model.transforms import TRANSFORMS

_RULE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")


def read_transform(top: Section, source: SourceSpec) -> tuple[str | SqlTransform, dict[str, str | None]]:
    """The stream's transform, and the columns (with their types where known) it hands on."""
    raw = top.get("transform", (str, Mapping), "identity")
    if isinstance(raw, Mapping):
        section = top.section("transform")
        text = section.get("sql", str, required=True)
        section.done()
        try:
            transform = parse_transform(text, source.columns)
        except SqlError as exc:
            raise section.error("sql", str(exc)) from None
        # The rescued data rides along beside the select list, as the lineage does: a transform cannot lose it.
        rescued = {RESCUED_COLUMN: "STRING"} if source.rescues else {}
        return transform, {**dict(transform.columns), **rescued}
    spec = TRANSFORMS.get(raw)
    if spec is None:
        raise top.error("transform", f"unknown transform {raw!r}; known Python transforms: "
                                     f"{', '.join(sorted(TRANSFORMS))}, or write it in SQL: {{sql: SELECT ...}}")
    missing = [column for column in spec.required_columns if column not in source.schema.names]
    if missing:
        raise top.error("transform", f"transform {raw!r} needs column(s) {', '.join(missing)}, which the source "
                                     "schema does not declare")
    return raw, {**source.columns, **{column: None for column in spec.adds_columns if column not in source.columns}}


def read_expectations(top: Section, columns: Columns) -> tuple[Expectation, ...]:
    """The stream's ``expectations``: a mapping of rule names to ``{check, on_violation, on_null}``."""
    section = top.section("expectations")
    rules = []
    for name in list(section.raw):
        if not isinstance(name, str) or not _RULE_NAME.match(name):
            raise section.error(str(name), f"a rule's name must match {_RULE_NAME.pattern} (reports and dead-letter "
                                           "reasons name it)")
        rule = section.section(name, required=True)
        check = rule.get("check", str, required=True)
        expectation = Expectation(name=name, check=check,
                                  on_violation=rule.enum("on_violation", Violation, Violation.WARN),
                                  on_null=rule.enum("on_null", NullResult, NullResult.VIOLATES))
        rule.done()
        try:
            check_expression(check, columns, what=f"the check of {name!r}")
        except SqlError as exc:
            raise rule.error("check", str(exc)) from None
        rules.append(expectation)
    return tuple(rules)
