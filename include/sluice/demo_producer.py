"""Demo producer: realistic clickstream events and order exports written into the landing zone.

Users sign up, start sessions, click through pages and buy things. Like real feeds, a few events arrive late, some
are delivered twice, and some are malformed (broken JSON, an amount that is not a number, a missing timestamp).
Files appear atomically: each is written under a hidden name and renamed into place, as an uploader should.

    python -m sluice.demo_producer --landing-root data/landing --files 3
    python -m sluice.demo_producer --landing-root data/landing --loop --interval 30
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import random
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

PAGES = ("/", "/search", "/product/espresso-grinder", "/product/pour-over-kettle", "/product/beans-ethiopia",
         "/cart", "/checkout")
CURRENCIES = ("EUR", "USD", "GBP")

# The schema of the events this producer writes, as a catalog declares it.
EVENT_SCHEMA = {
    "event_id": "string not null",
    "event_type": "string not null",
    "user_id": "string not null",
    "session_id": "string",
    "page": "string",
    "amount": "decimal(12,2)",
    "currency": "string",
    "event_time": "timestamp not null",
}


@dataclass
class ProducedBatch:
    """What one call wrote: the files, and how many lines of each kind, so tests can check counts exactly."""

    files: list[Path] = field(default_factory=list)
    events: int = 0
    duplicates: int = 0
    late: int = 0
    malformed: int = 0
    orders: int = 0
    malformed_orders: int = 0

    @property
    def event_lines(self) -> int:
        return self.events + self.duplicates + self.malformed


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def _iso(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class DemoProducer:
    """Generates a user population and emits event files and order exports from it."""

    def __init__(self, landing_root: str | os.PathLike[str], *, seed: int = 7, users: int = 50,
                 malformed_rate: float = 0.02, duplicate_rate: float = 0.03, late_rate: float = 0.05) -> None:
        self.landing = Path(landing_root)
        self.random = random.Random(seed)
        self.users = [f"u{index:04d}" for index in range(users)]
        self.malformed_rate = malformed_rate
        self.duplicate_rate = duplicate_rate
        self.late_rate = late_rate
        self.sequence = 0

    def _event(self, now: datetime) -> dict[str, object]:
        user = self.random.choice(self.users)
        kind = self.random.choices(["session_start", "click", "purchase", "user_signup"], [20, 60, 12, 8])[0]
        moment = now - timedelta(seconds=self.random.uniform(0, 60))
        event: dict[str, object] = {
            "event_id": str(uuid.UUID(int=self.random.getrandbits(128))),
            "event_type": kind if self.random.random() > 0.1 else kind.upper(),
            "user_id": user,
            "session_id": f"s-{user}-{self.random.randint(1, 5)}",
            "event_time": _iso(moment),
        }
        if kind == "click":
            event["page"] = self.random.choice(PAGES)
        if kind == "purchase":
            event["amount"] = round(self.random.uniform(3, 250), 2)
            event["currency"] = self.random.choice(CURRENCIES)
        return event

    def _malformed_line(self, now: datetime) -> str:
        event = self._event(now)
        flavour = self.random.randrange(3)
        if flavour == 0:
            return json.dumps(event)[:-7]  # truncated mid-record by a broken uploader
        if flavour == 1:
            event["event_type"], event["amount"] = "purchase", "twelve euros"
            return json.dumps(event)
        event.pop("event_time")
        return json.dumps(event)

    def events_file(self, *, lines: int = 200, now: datetime | None = None) -> ProducedBatch:
        """One JSON-lines file of ``lines`` events under ``<landing>/events/<date>/``."""
        now = now or datetime.now(timezone.utc)
        produced = ProducedBatch()
        out: list[str] = []
        for _ in range(lines):
            if self.random.random() < self.malformed_rate:
                out.append(self._malformed_line(now))
                produced.malformed += 1
                continue
            event = self._event(now)
            if self.random.random() < self.late_rate:
                event["event_time"] = _iso(now - timedelta(hours=self.random.uniform(1, 30)))
                produced.late += 1
            out.append(json.dumps(event))
            produced.events += 1
            if self.random.random() < self.duplicate_rate:
                out.append(json.dumps(event))  # at-least-once delivery upstream
                produced.duplicates += 1
        self.sequence += 1
        path = self.landing / "events" / now.strftime("%Y-%m-%d") / f"events-{now:%H%M%S}-{self.sequence:06d}.json"
        _write_atomically(path, "\n".join(out) + "\n")
        produced.files.append(path)
        return produced

    def orders_file(self, *, rows: int = 40, now: datetime | None = None) -> ProducedBatch:
        """One CSV export of ``rows`` orders under ``<landing>/orders/``."""
        now = now or datetime.now(timezone.utc)
        produced = ProducedBatch()
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(["order_id", "user_id", "amount", "currency", "status", "ordered_at"])
        for _ in range(rows):
            amount: object = round(self.random.uniform(3, 250), 2)
            if self.random.random() < self.malformed_rate:
                amount = "n/a"
                produced.malformed_orders += 1
            else:
                produced.orders += 1
            writer.writerow([
                f"o-{uuid.UUID(int=self.random.getrandbits(128)).hex[:12]}",
                self.random.choice(self.users),
                amount,
                self.random.choice(CURRENCIES),
                self.random.choice(["paid", "paid", "paid", "refunded"]),
                _iso(now - timedelta(minutes=self.random.uniform(0, 10))),
            ])
        self.sequence += 1
        path = self.landing / "orders" / f"orders-{now:%Y%m%d-%H%M%S}-{self.sequence:06d}.csv"
        _write_atomically(path, buffer.getvalue())
        produced.files.append(path)
        return produced

    def produce(self, *, files: int = 3, lines: int = 200, now: datetime | None = None) -> ProducedBatch:
        """``files`` event files plus one order export."""
        total = ProducedBatch()
        for _ in range(files):
            part = self.events_file(lines=lines, now=now)
            total.files += part.files
            total.events += part.events
            total.duplicates += part.duplicates
            total.late += part.late
            total.malformed += part.malformed
        orders = self.orders_file(now=now)
        total.files += orders.files
        total.orders, total.malformed_orders = orders.orders, orders.malformed_orders
        return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sluice.demo_producer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--landing-root", default=os.environ.get("SLUICE_LANDING_ROOT", "data/landing"))
    parser.add_argument("--files", type=int, default=3, help="event files per round")
    parser.add_argument("--lines", type=int, default=200, help="events per file")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--loop", action="store_true", help="keep producing a round every --interval seconds")
    parser.add_argument("--interval", type=float, default=30.0)
    args = parser.parse_args(argv)
    producer = DemoProducer(args.landing_root, seed=args.seed if args.seed is not None else int(time.time()))
    while True:
        batch = producer.produce(files=args.files, lines=args.lines)
        print(json.dumps({"files": len(batch.files), "events": batch.events, "duplicates": batch.duplicates,
                          "late": batch.late, "malformed": batch.malformed, "orders": batch.orders,
                          "malformed_orders": batch.malformed_orders}), flush=True)
        if not args.loop:
            return 0
        time.sleep(args.interval)


if __name__ == "__main__":
    raise SystemExit(main())
