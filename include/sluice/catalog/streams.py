"""The catalog as a whole: its streams by name, how they feed each other, and the folders no two of them may share."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from sluice.errors import CatalogError
from sluice.limits import RESERVED_ROOT_FOLDERS
from sluice.model.sources import SourceSpec
from sluice.model.stream import StreamSpec, WrittenPath
from sluice.paths import Roots, resolved_key


@dataclass(frozen=True)
class Catalog:
    """All streams, by name, in catalog order."""

    streams: Mapping[str, StreamSpec]
    source_file: str | None = None

    def __iter__(self) -> Iterator[StreamSpec]:
        return iter(self.streams.values())

    def __len__(self) -> int:
        return len(self.streams)

    def get(self, name: str) -> StreamSpec:
        try:
            return self.streams[name]
        except KeyError:
            known = ", ".join(self.streams) or "none"
            raise CatalogError(f"unknown stream {name!r}; the catalog has: {known}") from None

    def upstream_of(self, stream: StreamSpec) -> StreamSpec | None:
        """The stream whose table a Delta-source or an Iceberg-source stream reads, when another stream of the
        catalog writes it."""
        return self._writer_of(stream.source)

    def upstreams_of(self, stream: StreamSpec) -> list[StreamSpec]:
        """Every catalog stream whose table this stream reads: its source's, and its joined source's."""
        join = stream.patterns.join
        found = [self.upstream_of(stream), self._writer_of(join.source) if join is not None else None]
        return [upstream for upstream in found if upstream is not None]

    def _writer_of(self, source: SourceSpec) -> StreamSpec | None:
        """The stream that writes the table a Delta source reads (as its sink, or as one of its fan-out tables), or
        the Iceberg table an Iceberg source reads (the same identifier in the same catalog, as its sink or one of its
        fan-out tables)."""
        from sluice.kinds.iceberg import IcebergSink, IcebergSource

        if isinstance(source, IcebergSource):
            return next((other for other in self if isinstance(other.sink, IcebergSink)
                         and other.sink.catalog == source.catalog
                         and source.identifier in {other.sink.identifier,
                                                   *(spec.table for spec in other.patterns.fan_out)}), None)
        if source.table is None:
            return None
        wanted = os.path.normpath(source.table)
        return next((other for other in self if wanted in {os.path.normpath(path) for path in other.table_paths}),
                    None)

    def select(self, names: list[str]) -> list[StreamSpec]:
        if not names:
            raise CatalogError("no stream named; pass at least one stream")
        return [self.get(name) for name in names]

    def check_roots(self, roots: Roots) -> None:
        """Refuse what only the deployment's roots reveal, before anything is written under them.

        Loading compares relative paths under one root, and absolute paths with each other. Here every checkpoint
        and table is resolved (links included, for local paths) and must not: be or contain a root; lie in Sluice's
        own folders under the checkpoint and lake roots (``_backfill``, ``_sluice``); be, contain or lie inside another
        stream's checkpoint or table (an absolute ``/data/lake/bronze/events`` and a relative ``bronze/events`` under
        the lake root ``/data/lake`` are one table), or a file source's landing folder (the stream would read Delta's
        files as its input).
        """
        root_keys = {name: resolved_key(getattr(roots, name), ".") for name in ("landing", "lake", "checkpoints")}
        reserved = [(f"{folder}/ under the {name} root", (root_keys[name][0], (*root_keys[name][1], folder.casefold())))
                    for name in ("checkpoints", "lake") for folder in RESERVED_ROOT_FOLDERS]
        claims = Claims()
        for stream in self:
            for written in stream.written_paths:
                key = resolved_key(getattr(roots, written.root), written.path)
                shown = f"{written.path!r} (resolved: {_show(key)})"
                for name, root_key in root_keys.items():
                    if _inside(key, root_key):
                        raise written.error(f"{written.what} {shown} is or contains the {name} root "
                                            f"{getattr(roots, name)!r}, which holds every stream's data")
                for folder, folder_key in reserved:
                    if _inside(folder_key, key):
                        raise written.error(f"{written.what} {shown} lies in {folder}, a folder Sluice keeps for "
                                            "itself (the run log, backfill checkpoints, the lag history)")
                claims.claim(key, written, shown=shown)
        for stream in self:
            if stream.source.landing is None:
                continue
            key = resolved_key(roots.landing, stream.source.landing)
            other = claims.overlapping(key)
            if other is not None:
                raise CatalogError(f"the landing folder {_show(key)} overlaps {other.what} {other.path!r} of stream "
                                   f"'{other.stream}': the stream would read Delta's own files as its input",
                                   stream=stream.name, field="source.path")


_Key = tuple[str, tuple[str, ...]]


def _inside(outer: _Key, inner: _Key) -> bool:
    """True when ``inner`` is ``outer`` or lies under it."""
    return outer[0] == inner[0] and inner[1][:len(outer[1])] == outer[1]


def _show(key: _Key) -> str:
    storage, parts = key
    return storage + "/".join(parts) if storage.endswith("/") else "/".join((storage, *parts))


class Claims:
    """The folders the streams write. Two of them must not be one folder: checkpoints would mix two queries'
    logs, tables two streams' commits (and a batch's second write would be skipped as a replay). One must not lie
    inside another either: a table's VACUUM deletes the files it does not know, and a checkpoint's repair moves
    everything under it."""

    def __init__(self) -> None:
        self.claims: dict[_Key, tuple[WrittenPath, str]] = {}
        # Every folder above a claimed one, with a claim below it.
        self.above: dict[_Key, tuple[WrittenPath, str]] = {}

    def overlapping(self, key: _Key) -> WrittenPath | None:
        """A claim that is ``key``, lies inside it, or holds it."""
        storage, parts = key
        for length in range(len(parts), 0, -1):
            found = self.claims.get((storage, parts[:length]))
            if found is not None:
                return found[0]
        found = self.above.get(key)
        return found[0] if found is not None else None

    def claim(self, key: _Key, written: WrittenPath, *, shown: str) -> None:
        storage, parts = key
        if key in self.claims:
            other, other_shown = self.claims[key]
            raise written.error(f"{written.what} {shown} is already used by stream '{other.stream}' as its "
                                f"{other.what} {other_shown}; each stream needs its own")
        for length in range(len(parts) - 1, 0, -1):
            if (storage, parts[:length]) in self.claims:
                other, other_shown = self.claims[(storage, parts[:length])]
                raise written.error(f"{written.what} {shown} lies inside the {other.what} {other_shown} of stream "
                                    f"'{other.stream}'; {self.why(written, other)}")
        if key in self.above:
            other, other_shown = self.above[key]
            raise written.error(f"{written.what} {shown} holds the {other.what} {other_shown} of stream "
                                f"'{other.stream}'; {self.why(written, other)}")
        self.claims[key] = (written, shown)
        for length in range(len(parts) - 1, 0, -1):
            self.above.setdefault((storage, parts[:length]), (written, shown))

    @staticmethod
    def why(written: WrittenPath, other: WrittenPath) -> str:
        kinds = {written.root, other.root}
        if kinds == {"checkpoints"}:
            return "a checkpoint's repair and reset move everything under it; give each its own folder"
        if kinds == {"lake"}:
            return "a table's VACUUM deletes the files it does not know; give each its own folder"
        return "a table's VACUUM would delete the checkpoint's files; give each its own folder"
