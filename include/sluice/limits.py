"""Upper bounds on what a catalog may declare, in one place.

Every number of the catalog ends up in a ``timedelta``, a Spark interval (microseconds in a 64-bit long), a SQLite
integer or a ``LIMIT``; an unbounded one overflows there, far from the catalog line that caused it. Each bound is
generous for real use and far below any overflow; a refusal names the field and its bound.
"""

from __future__ import annotations

DAY_SECONDS = 86_400

# -- the YAML document -----------------------------------------------------------------------------------------------

# A catalog file larger than this is refused before it is parsed (a catalog of a thousand streams is about 2 MiB).
CATALOG_MAX_BYTES = 16 * 1024 * 1024
# How many YAML values (parser events: scalars, the starts and ends of lists and mappings) a catalog may hold, counted
# as it is read: the bundled catalog holds about 90 per stream. Past it, the document is refused before it is built.
YAML_MAX_EVENTS = 200_000
# How many nodes aliases may add to the document, beyond its own (billion laughs). Reusing an `alerts` block in a
# thousand streams adds about 10,000.
YAML_MAX_ALIAS_NODES = 100_000
# How deeply values may nest once aliases are expanded (a catalog needs about 10; an inline Avro schema more).
YAML_MAX_DEPTH = 64
# The longest integer literal: Python refuses to convert one of more than 4,300 digits, and no catalog number needs
# more than 19 (a 64-bit long).
YAML_MAX_INT_CHARS = 40

# -- the streams -----------------------------------------------------------------------------------------------------

TRIGGER_MAX_FILES = 1_000_000
TRIGGER_MAX_BYTES = 1 << 40  # 1 TiB per micro-batch
# A run of the rs engine whose source holds at most this much unread has its batches collected to the driver
# (``SLUICE_DRIVER_WRITE_MAX_BYTES`` overrides it; 0 turns it off).
DRIVER_WRITE_MAX_BYTES = 64 * 1024 * 1024
# A cold run whose sources hold at most this much unread starts its driver's JVM with the C1 compiler alone
# (``SLUICE_JIT_SMALL_RUN_MAX_BYTES`` overrides it; 0 turns it off): see :mod:`sluice.operations.jvm`.
JIT_SMALL_RUN_MAX_BYTES = 16 * 1024 * 1024
# Any duration the catalog declares: alert ages, staleness, watermark delays, join bounds, window lengths.
MAX_DURATION_SECONDS = 3650 * DAY_SECONDS
ALERT_MAX = {
    "records": 10**15,  # Kafka offsets and Delta rows, far inside a 64-bit long
    "files": 1_000_000_000,
    "bytes": 1 << 60,  # 1 EiB
    "seconds": MAX_DURATION_SECONDS,
}
MAX_OBSERVATIONS = 1_000  # stall and resolve windows of the lag monitor (every 5 minutes: about 3.5 days)
BACKFILL_MAX_RANGE_DAYS = 3650
BACKFILL_MAX_CLOCK_SKEW_SECONDS = 30 * DAY_SECONDS

# -- the paths -------------------------------------------------------------------------------------------------------

# Sluice's own folders directly under the checkpoint root: ``_backfill/<stream>/<run id>`` holds backfill
# checkpoints, ``_sluice/`` the lag history. No catalog checkpoint or table may start with them: with the lake and
# checkpoint roots in one folder, a table named so would share it too.
RESERVED_ROOT_FOLDERS = ("_backfill", "_sluice")
# The names the repair tools give the copies they make beside a checkpoint (``<checkpoint>.backup-<time>``...). A
# checkpoint named so would pass for a copy that an operator may delete.
REPAIR_COPY_MARKERS = (".backup-", ".reset-", ".quarantine-")

# Kafka offsets per micro-batch (maxOffsetsPerTrigger, minOffsetsPerTrigger): Spark reads them as a 64-bit long.
KAFKA_MAX_OFFSETS_PER_TRIGGER = 10**15

# -- catalog SQL -----------------------------------------------------------------------------------------------------

# The longest SQL text (a transform, a check, a fan-out's where): sqlglot's checks grow faster than the text.
SQL_MAX_CHARS = 20_000
# How deeply SQL may nest (parentheses, brackets, CASE); an expression tree may be four times as tall (a chain of
# ANDs). sqlglot's parser recurses per level, and Python's stack holds about 60 of its levels.
SQL_MAX_DEPTH = 24
# A declared type (``struct<...>``): its length and how deeply it nests (a JSON document's schema nests about 10).
TYPE_MAX_CHARS = 100_000
TYPE_MAX_DEPTH = 32

# -- what Sluice reads back ------------------------------------------------------------------------------------------

# The largest batch id a checkpoint file name may carry: Spark's batch ids are longs. A longer name is not Spark's.
MAX_BATCH_ID = 2**63 - 1
# The largest checkpoint file Sluice reads. Spark's ``metadata``, ``offsets/N`` and ``commits/N`` are a few KiB (a
# Kafka topic of 10,000 partitions writes about 300 KiB of offsets); a compacted file-source log holds a line of about
# 200 bytes per file the stream ever read (a million files: about 200 MiB).
CHECKPOINT_FILE_MAX_BYTES = 16 * 1024 * 1024
SOURCE_LOG_MAX_BYTES = 1024 * 1024 * 1024
