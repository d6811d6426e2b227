"""A finding of a check: a stable code, a severity, a message that says what happened and what to do, evidence."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sluice.constants import FaultCode, Severity


@dataclass
class Finding:
    code: FaultCode
    severity: Severity
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)
