"""Expectations: row rules a stream's catalog entry declares, and what happens to a row that breaks one.

A rule is a Spark SQL boolean expression over the row after the transform (:mod:`sluice.model.sql` checks it when
the catalog loads). A row that broke several rules meets the strongest action among them: ``fail`` over
``quarantine`` over ``drop`` over ``warn``. Rows the reader already rejected (unparseable, a failed cast, a missing
``not null`` field) are in the dead-letter table before any rule sees them, and are not checked.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.constants import Word


class Violation(Word):
    """What a broken rule does to its row, weakest first."""

    # Keep the row and count it.
    WARN = "warn"
    # Leave the row out of every table and count it: rows in = written + dropped + dead-lettered.
    DROP = "drop"
    # Send the row to the dead-letter table, with every rule it broke in the reason.
    QUARANTINE = "quarantine"
    # Stop the run before the batch commits anywhere, naming the rule, how many rows broke it and an example.
    FAIL = "fail"

    @property
    def strength(self) -> int:
        return list(Violation).index(self)


class NullResult(Word):
    """How a rule whose check gives NULL (it names a NULL column) counts."""

    VIOLATES = "violates"
    PASSES = "passes"


@dataclass(frozen=True)
class Expectation:
    """One rule: its ``name`` (as reports and dead-letter reasons name it), its ``check``, and its action."""

    name: str
    check: str
    on_violation: Violation
    on_null: NullResult = NullResult.VIOLATES


#: The reason a quarantined row carries in the dead-letter table: the rules it broke follow.
QUARANTINE_REASON = "broke expectation(s): "
