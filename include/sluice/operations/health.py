"""Checkpoint health checks: the gate in front of every run. Plain files, delta-rs and pyiceberg, no JVM.

A report has a status (OK, WARN or FAIL), findings with stable codes, messages that say what happened and what to
do, and evidence; and facts about the checkpoint. FAIL stops the run before Spark starts. Repair is never
automatic: the messages point at ``python -m sluice repair``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from sluice.constants import FaultCode, Severity
from sluice.errors import printable
from sluice.kinds import sink_table_format, source_kind, table_formats
from sluice.model.findings import Finding
from sluice.model.stream import StreamSpec
from sluice.model.transforms import TRANSFORMS
from sluice.paths import Roots
from sluice.storage.checkpoint import CheckpointError, CheckpointReader, OffsetEntry, gaps, read_query_id
from sluice.storage.lock import LockFileError
from sluice.storage.object_lock import read_lock_at
from sluice.times import iso_utc

# A finding's weight; the name the checks and their callers have always used.
Health = Severity

_RANK = {Health.OK: 0, Health.WARN: 1, Health.FAIL: 2}
# What the Streams page and ``make status`` show for a stream whose only FAIL is the lock of a live run.
RUNNING = "RUNNING"


@dataclass
class HealthReport:
    stream: str
    checkpoint: str
    findings: list[Finding] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> Health:
        return max((f.severity for f in self.findings), key=_RANK.__getitem__, default=Health.OK)

    @property
    def codes(self) -> list[str]:
        return [finding.code for finding in self.findings]

    @property
    def waits_for_a_run(self) -> bool:
        """Whether the report FAILs only because a live run holds the stream's lock (a LOCKED finding that names the
        run, not a lock path Sluice cannot use): that clears when the run ends, so a retry of the check can pass."""
        fails = [finding for finding in self.findings if finding.severity is Health.FAIL]
        return bool(fails) and all(finding.code is FaultCode.LOCKED and "run_id" in finding.evidence
                                   for finding in fails)

    def _held_by_a_run(self, finding: Finding) -> bool:
        return finding.code is FaultCode.LOCKED and "run_id" in finding.evidence

    def _part_of_the_run(self, finding: Finding) -> bool:
        """The live run's lock, or the one batch it has planned and not yet committed: what a run in progress looks
        like, not a fault (the same batch after a run that stopped is one, and the gate sees it then)."""
        return self._held_by_a_run(finding) or (
            finding.code is FaultCode.UNCOMMITTED_BATCH and finding.severity is Health.WARN
            and any(self._held_by_a_run(other) for other in self.findings))

    @property
    def running(self) -> dict[str, Any] | None:
        """The live run that holds the stream's lock: its run id, since when, host and pid; None when no run holds
        it (a lock Sluice cannot use is no run's, and stays a FAIL)."""
        held = next((finding for finding in self.findings if self._held_by_a_run(finding)), None)
        return None if held is None else {key: held.evidence.get(key) for key in ("run_id", "since", "host", "pid")}

    @property
    def shown_status(self) -> str:
        """The status people see (the Streams page, ``make status``): RUNNING while a live run holds the lock and
        nothing else fails, else the gate's OK, WARN or FAIL. The gate itself still waits on the LOCKED finding."""
        return RUNNING if self.waits_for_a_run else self.status.value

    def shown_findings(self) -> list[dict[str, Any]]:
        """The findings as people see them: the lock of a live run, and the batch it is writing, as RUNNING."""
        return [{**asdict(finding), "code": finding.code.value,
                 "severity": RUNNING if self._part_of_the_run(finding) else finding.severity.value,
                 **({"message": f"batch {finding.evidence['batches'][0]} is being written by the running run"}
                    if self._part_of_the_run(finding) and finding.code is FaultCode.UNCOMMITTED_BATCH else {})}
                for finding in self.findings]

    def shown_codes(self) -> list[str]:
        """The codes of the findings that are not OK, a live run's lock and batch aside (shown as RUNNING)."""
        return list(dict.fromkeys(finding.code.value for finding in self.findings
                                  if finding.severity is not Health.OK and not self._part_of_the_run(finding)))

    def add(self, code: FaultCode, severity: Health, message: str, **evidence: Any) -> None:
        self.findings.append(Finding(code, severity, message, evidence))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status.value
        for finding in data["findings"]:
            finding["severity"] = finding["severity"].value
        data["shown_status"], data["running"] = self.shown_status, self.running
        return data

    def describe(self) -> str:
        lines = [f"checkpoint health of stream '{self.stream}' ({self.checkpoint}): {self.status.value}"]
        lines += [f"  [{f.severity.value}] {f.code}: {f.message}" for f in self.findings]
        return "\n".join(map(printable, lines))


def _repair(stream: str, action: str) -> str:
    return f"python -m sluice repair {action} --stream {stream}"


def check_stream(stream: StreamSpec, roots: Roots, *, now: float | None = None) -> HealthReport:
    """Every check of one stream's checkpoint, against the catalog and the stream's Delta tables."""
    now = now or time.time()
    checkpoint = stream.checkpoint_path(roots)
    reader = CheckpointReader(checkpoint)
    report = HealthReport(stream=stream.name, checkpoint=checkpoint)

    try:
        holder = read_lock_at(checkpoint)
    except LockFileError as exc:
        holder = None
        report.add(FaultCode.LOCKED, Health.FAIL, f"{exc}; until then no run can take the stream's lock",
                   path=str(exc.path), kind=exc.kind)
    if holder is not None and not holder.is_stale(now):
        report.add(FaultCode.LOCKED, Health.FAIL,
                   f"run {holder.run_id!r} on {holder.host} (pid {holder.pid}) holds the stream's lock; wait for it "
                   f"to finish. A dead holder's lock expires {holder.expires_after_seconds}s after its last heartbeat",
                   run_id=holder.run_id, since=iso_utc(holder.acquired_at, timespec="seconds"), host=holder.host,
                   pid=holder.pid, heartbeat_age_s=round(holder.age_seconds(now)))

    report.findings += source_kind(stream.source).findings(stream, roots)
    offsets, commits = reader.offset_ids(), reader.commit_ids()
    for odd in reader.odd_log_files():
        report.add(FaultCode.ODD_LOG_FILE, Health.WARN,
                   f"{printable(odd)} is named as no batch Spark writes (a plain decimal of at most 2**63-1): Spark "
                   "and Sluice skip it, but someone put it there. Look at what it is, then remove it", file=odd)
    query_id = _check_metadata(report, reader, stream, has_batches=bool(offsets or commits))
    report.facts.update(query_id=query_id, batches_retained=len(offsets), latest_offsets_batch=offsets[-1] if offsets
                        else None, last_batch_id=commits[-1] if commits else None)
    if not offsets and not commits:
        report.add(FaultCode.NEW, Health.OK,
                   "no batch has run yet; the first run starts from the beginning of the source")
        if query_id is None:
            _check_sink_knows_query(report, stream, roots, query_id)
        else:
            _check_sink(report, stream, roots, query_id, offsets, commits)
        return report

    _check_logs(report, reader, stream, offsets, commits)
    _check_sink(report, stream, roots, query_id, offsets, commits)
    if commits:
        last_commit = reader.commit_time(commits[-1])
        age = now - last_commit
        report.facts["last_commit_time"] = iso_utc(last_commit)
        report.facts["seconds_since_last_commit"] = round(age)
        stale_after = stream.alerts.stale_after_seconds
        if stale_after is not None and age > stale_after:
            report.add(FaultCode.STALE, Health.WARN,
                       f"no batch committed for {age:.0f}s (threshold {stale_after}s); check that the DAG is "
                       "scheduled and unpaused, and that the source still receives data",
                       last_batch_id=commits[-1], seconds_since_last_commit=round(age))
    report.facts["state_bytes"] = reader.state_bytes()
    spec = TRANSFORMS.get(stream.transform) if isinstance(stream.transform, str) else None
    stateful = stream.patterns.stateful or (spec is not None and spec.stateful)
    if stateful and commits and not reader.has_state():
        report.add(FaultCode.STATE_MISSING, Health.FAIL,
                   "the stream is stateful but its checkpoint has no state/ folder; restore the checkpoint from a "
                   "backup, or reset the stream and rebuild its state",
                   last_batch_id=commits[-1])
    return report


def _check_metadata(report: HealthReport, reader: CheckpointReader, stream: StreamSpec, *,
                    has_batches: bool) -> str | None:
    try:
        query_id = read_query_id(reader.folder)
    except CheckpointError as exc:
        report.add(FaultCode.METADATA_CORRUPT, Health.FAIL,
                   f"{exc}. Re-pin it: {_repair(stream.name, 'repin-query-id')}",
                   file=reader.where("metadata"))
        return None
    if query_id is None and has_batches:
        report.add(FaultCode.METADATA_MISSING, Health.FAIL,
                   "the checkpoint has batches but no metadata file: Spark would start a new query id, and the Delta "
                   "sink would no longer recognise replayed batches (duplicates). Re-pin the id recorded in the "
                   f"sink: {_repair(stream.name, 'repin-query-id')}", file=reader.where("metadata"))
    return query_id


def _check_logs(report: HealthReport, reader: CheckpointReader, stream: StreamSpec, offsets: list[int],
                commits: list[int]) -> None:
    if offsets:
        latest = offsets[-1]
        try:
            entry = reader.read_offsets(latest)
        except CheckpointError as exc:
            report.add(FaultCode.OFFSETS_CORRUPT, Health.FAIL,
                       f"{exc}. The file is torn (a crash while Spark wrote it, or a damaged copy). Quarantine it so "
                       f"that Spark plans batch {latest} again: {_repair(stream.name, 'quarantine-offsets')}",
                       batch_id=latest, file=reader.where("offsets", str(latest)))
        else:
            if len(entry.sources) != stream.checkpoint_sources:
                report.add(FaultCode.SOURCE_COUNT_MISMATCH, Health.FAIL,
                           f"the checkpoint records {len(entry.sources)} source(s), the catalog stream reads "
                           f"{stream.checkpoint_sources}: the checkpoint belongs to another query, or the stream "
                           "gained or lost a stateful step or a join since it was written. Point the stream at its "
                           "own checkpoint, or give the changed stream a new one",
                           batch_id=latest, sources=len(entry.sources))
            _check_source_logs(report, reader, stream, entry)
    planned = set(offsets)
    missing_offsets = [batch for batch in commits if batch not in planned and (not offsets or batch >= offsets[0])]
    if missing_offsets or (commits and offsets and commits[-1] > offsets[-1]) or (commits and not offsets):
        report.add(FaultCode.COMMIT_WITHOUT_OFFSETS, Health.FAIL,
                   "commits exist for batches that have no offsets file; the checkpoint was edited or restored "
                   "partially. Restore it from a backup", batches=missing_offsets or commits[-1:])
    for log_name, ids in (("offsets", offsets), ("commits", commits)):
        missing, count = gaps(ids)
        if missing:
            report.add(FaultCode.GAP, Health.FAIL, f"{log_name}/ is missing {count} batch(es), {missing[:20]}"
                       f"{' and more' if count > 20 else ''}, between {ids[0]} and {ids[-1]}; Spark cannot replay "
                       "across a gap. Restore the checkpoint from a backup", log=log_name, missing=missing,
                       missing_count=count)
    if offsets and (not commits or offsets[-1] > commits[-1]):
        uncommitted = [b for b in offsets if not commits or b > commits[-1]]
        severity = Health.WARN if len(uncommitted) == 1 else Health.FAIL
        report.add(FaultCode.UNCOMMITTED_BATCH, severity,
                   f"batch {uncommitted[0]} was planned but never committed (the last run stopped during it); Spark "
                   "will replay it, and the Delta sink skips what it already holds"
                   + ("" if severity is Health.WARN else f"; {len(uncommitted)} uncommitted batches is not a state "
                      "Spark leaves behind: restore the checkpoint from a backup"),
                   batches=uncommitted[:20])


def _check_source_logs(report: HealthReport, reader: CheckpointReader, stream: StreamSpec,
                       entry: OffsetEntry) -> None:
    """What each source of the checkpoint needs beyond offsets/ and commits/ to resume. A file source (its offset is
    ``{"logOffset": N}``) needs its own log of the files each batch read, ``sources/<i>/``, through batch N; Kafka and
    Delta sources resume from their offsets alone."""
    for index, offset in enumerate(entry.sources):
        if not isinstance(offset, dict) or not isinstance(offset.get("logOffset"), int) or offset["logOffset"] < 0:
            continue
        missing = reader.missing_file_source_batches(index, offset["logOffset"])
        if missing:
            report.add(FaultCode.SOURCE_LOG_MISSING, Health.FAIL,
                       f"the file source log sources/{index}/ lacks batch(es) {missing[:20]} of the "
                       f"{offset['logOffset'] + 1} that batch {entry.batch_id}'s offsets refer to: Spark cannot "
                       "resume the stream (\"batch N doesn't exist\") and no retry can fix that. Restore the "
                       "checkpoint from a backup (python -m sluice repair backup keeps them beside it); without "
                       "one, give the stream a new checkpoint and rebuild its table",
                       source=index, log_offset=offset["logOffset"], missing=missing[:100],
                       folder=reader.where("sources", str(index)))


def _check_sink(report: HealthReport, stream: StreamSpec, roots: Roots, query_id: str | None,
                offsets: list[int], commits: list[int]) -> None:
    """The sink must not hold a batch the checkpoint never planned: that means the checkpoint went back in time.
    Every table is read through the table-format seam: Delta's transactions, Iceberg's snapshot summaries."""
    if query_id is None:
        return
    planned = offsets[-1] if offsets else -1
    known_to_sink = False
    # A cdc sink's tombstones too: a reset that rolled the table back and left them ahead would have the replayed
    # batches' deletes skipped there, and the deletes of batches never replayed remembered.
    for role, table in table_formats(stream, roots, tombstones=True):
        committed = table.recorded_batch(query_id)
        known_to_sink = known_to_sink or committed is not None
        if committed is not None and committed > planned:
            last = commits[-1] if commits else -1
            sink = sink_table_format(stream, roots)
            reachable = sink.version_holding(query_id, last) if sink is not None else 0
            if sink is None or sink.format == "delta":
                remedy = (f"roll the tables back to where the checkpoint is, so that the next run reads the rest "
                          f"again: {_repair(stream.name, 'reset')} --version {reachable}")
            else:
                remedy = (f"roll the {sink.format} table back to snapshot {reachable} (repair reset rolls back Delta "
                          "tables only), so that the next run reads the rest again")
            report.add(FaultCode.SINK_AHEAD_OF_CHECKPOINT, Health.FAIL,
                       f"the {role} table holds batch {committed} of query {query_id}, but the checkpoint has only "
                       f"planned up to batch {planned}: it was restored from an old backup or rolled back, and a run "
                       "would read again files whose rows the table already has. Either restore the newest checkpoint "
                       "backup (python -m sluice repair backup keeps them beside the checkpoint), or " + remedy,
                       table=table.name, txn_version=committed, latest_offsets_batch=planned,
                       reset_version=reachable)
    if not known_to_sink:
        _check_sink_knows_query(report, stream, roots, query_id)


def _check_sink_knows_query(report: HealthReport, stream: StreamSpec, roots: Roots, query_id: str | None) -> None:
    """A checkpoint whose query id the stream's table has never seen, in front of a table that this stream already
    fed: the checkpoint was lost and recreated, or copied from another stream."""
    for role, table in table_formats(stream, roots):
        others = [qid for qid in table.query_ids(stream.name) if qid != query_id]
        if others:
            report.add(FaultCode.QUERY_ID_UNKNOWN_TO_SINK, Health.WARN if stream.allow_new_query_id else Health.FAIL,
                       f"the checkpoint's query id {query_id} is unknown to the {role} table, which holds commits of "
                       f"this stream from query {others[0]}: the checkpoint was lost and recreated, or copied from "
                       "another stream, and a run would ingest files again and duplicate rows. Restore the stream's "
                       "own checkpoint from a backup",
                       table=table.name, sink_query_ids=others[:5])
            return
