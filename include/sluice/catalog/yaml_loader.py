"""Reading the catalog's YAML: duplicate keys refused, aliases and nesting bounded, keys read as names.

PyYAML's safe loader keeps the last of two equal keys without a word (a second ``streams:`` drops the first list),
and it builds an alias as a shared object whose size, as the catalog is walked, grows tenfold per line of a
"billion laughs" document. This loader composes the document into YAML nodes first (aliases stay references there),
checks the nodes, and constructs Python objects only from a document that passed, so memory stays proportional to the
file. Anchors still work for what they are for: one ``alerts: &defaults {...}`` reused by many streams, and merge
keys (``<<: *defaults``) whose explicit keys override the merged ones. Before any node is built, the parser's events
are counted: a document of more values than :data:`YAML_MAX_EVENTS` is refused in a fraction of a second, however
close to the size limit it is.

Every refusal is a :class:`CatalogError` naming the stream (for a value inside a ``streams`` entry that has a name)
and the dotted field.
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.resolver import Resolver

from sluice.errors import CatalogError
from sluice.limits import YAML_MAX_ALIAS_NODES, YAML_MAX_DEPTH, YAML_MAX_EVENTS, YAML_MAX_INT_CHARS

_MERGE_TAG = "tag:yaml.org,2002:merge"
_INT_TAG = "tag:yaml.org,2002:int"
_STR_TAG = "tag:yaml.org,2002:str"


class _NamedText:
    """The text as libyaml reads a file, in chunks and without a copy, with the name PyYAML's messages quote."""

    def __init__(self, text: str, name: str) -> None:
        self.text = text
        self.name = name
        self.position = 0

    def read(self, size: int = -1) -> str:
        end = len(self.text) if size < 0 else self.position + size
        chunk = self.text[self.position:end]
        self.position += len(chunk)
        return chunk


if yaml.__with_libyaml__:
    from yaml._yaml import CParser

    # libyaml's parser, ten times as fast, with PyYAML's composer: that one recurses in Python, so that absurd
    # nesting ends in a RecursionError caught below, where libyaml's own composer would recurse in C.
    class _Loader(Composer, CParser, SafeConstructor, Resolver):
        def __init__(self, text: str, source: str) -> None:
            CParser.__init__(self, _NamedText(text, source))
            Composer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)
else:  # pragma: no cover - PyYAML without libyaml
    class _Loader(yaml.SafeLoader):  # type: ignore[no-redef]
        def __init__(self, text: str, source: str) -> None:
            super().__init__(text)
            self.name = source


def load_yaml(text: str, *, source: str) -> object:
    """The Python value of a one-document YAML text, after the checks above. ``source`` names it in messages."""
    loader = _Loader(text, source)
    try:
        _count_events(_Loader(text, source), source)
        node = loader.get_single_node()
        if node is None:
            return None
        _Checker(source, node).check()
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise CatalogError(f"catalog {source} is not valid YAML: {_one_line(exc)}") from exc
    except RecursionError:
        raise CatalogError(f"catalog {source} nests values too deeply to be read (at most {YAML_MAX_DEPTH} "
                           "levels)") from None
    finally:
        loader.dispose()


def _count_events(parser: _Loader, source: str) -> None:
    """Refuse a document of more than :data:`YAML_MAX_EVENTS` parser events before any of its nodes is built: a flow
    list of millions of one-letter items fits in the size limit, and its nodes would take gigabytes."""
    events = 0
    try:
        while parser.check_event():
            parser.get_event()
            events += 1
            if events > YAML_MAX_EVENTS:
                raise CatalogError(f"catalog {source} holds more than {YAML_MAX_EVENTS:,} YAML values; a catalog of a "
                                   "thousand streams holds about 100,000")
    finally:
        parser.dispose()


@dataclass(frozen=True)
class _Where:
    """Where a node is: its stream, when it lies inside a named ``streams`` entry, and its dotted field."""

    stream: str | None
    field: str

    def key(self, name: str) -> _Where:
        return _Where(self.stream, f"{self.field}.{name}" if self.field else name)

    def item(self, index: int) -> _Where:
        return _Where(self.stream, f"{self.field}[{index}]")

    def error(self, message: str) -> CatalogError:
        return CatalogError(message, stream=self.stream, field=self.field or None)


class _Checker:
    """One walk over the composed nodes. A node reached through several aliases is walked once: its expanded size
    and height are remembered, so the walk costs the document's own size however much aliases would expand."""

    def __init__(self, source: str, root: Node) -> None:
        self.source = source
        self.root = root
        self.own_nodes = _count_distinct(root)
        self.max_nodes = self.own_nodes + YAML_MAX_ALIAS_NODES
        # id(node) -> (expanded size, height); None while the node is being walked (an alias to it is a cycle).
        self.expanded: dict[int, tuple[int, int] | None] = {}
        self.stream_entries = _stream_entries(root)

    def check(self) -> None:
        self.visit(self.root, _Where(None, ""), 0)

    def line(self, node: Node) -> str:
        return f"line {node.start_mark.line + 1} of {self.source}"

    def visit(self, node: Node, where: _Where, depth: int) -> tuple[int, int]:
        name = self.stream_entries.get(id(node))
        if name is not None:
            where = _Where(name, "")
        if depth > YAML_MAX_DEPTH:
            raise where.error(f"values nest more than {YAML_MAX_DEPTH} levels deep ({self.line(node)})")
        if id(node) in self.expanded:
            seen = self.expanded[id(node)]
            if seen is None:
                raise where.error(f"the value anchored at {self.line(node)} contains an alias of itself")
            size, height = seen
        else:
            self.expanded[id(node)] = None
            size, height = self.walk(node, where, depth)
            self.expanded[id(node)] = (size, height)
        if depth + height > YAML_MAX_DEPTH:
            raise where.error(f"aliases nest values more than {YAML_MAX_DEPTH} levels deep ({self.line(node)})")
        if size > self.max_nodes:
            raise where.error(f"aliases expand this value ({self.line(node)}) to {size:,} YAML nodes, where the "
                              f"document holds {self.own_nodes:,}; aliases may add at most {YAML_MAX_ALIAS_NODES:,}. "
                              "Reuse an anchor, do not multiply it")
        return size, height

    def walk(self, node: Node, where: _Where, depth: int) -> tuple[int, int]:
        if isinstance(node, ScalarNode):
            if node.tag == _INT_TAG and len(node.value) > YAML_MAX_INT_CHARS:
                raise where.error(f"an integer of {len(node.value)} characters ({self.line(node)}); at most "
                                  f"{YAML_MAX_INT_CHARS}")
            return 1, 0
        children: list[tuple[Node, _Where]] = []
        if isinstance(node, SequenceNode):
            children = [(child, where.item(index)) for index, child in enumerate(node.value)]
        elif isinstance(node, MappingNode):
            first_line: dict[str, int] = {}
            for key, value in node.value:
                name = self.key_name(key, where)
                key_where = where.key(name)
                if name in first_line:
                    raise key_where.error(f"duplicate key {name!r} at {self.line(key)} (first at line "
                                          f"{first_line[name]}): YAML would silently keep only the last one")
                first_line[name] = key.start_mark.line + 1
                children += [(key, key_where), (value, key_where)]
        size, height = 1, 0
        for child, child_where in children:
            child_size, child_height = self.visit(child, child_where, depth + 1)
            size += child_size
            height = max(height, child_height + 1)
        return size, height

    def key_name(self, key: Node, where: _Where) -> str:
        """A mapping key as the catalog reads it. Catalog keys are names: a plain key is a string, so the docs'
        ``on: [user_id]`` is the key "on", not YAML 1.1's boolean true (and ``on`` never collides with ``true``)."""
        if not isinstance(key, ScalarNode):
            kind = "list" if isinstance(key, SequenceNode) else "mapping"
            raise where.error(f"a key must be a plain name, not a {kind} ({self.line(key)})")
        if key.tag == _MERGE_TAG:
            return "<<"
        if not key.style:  # plain: None from PyYAML's parser, "" from libyaml's
            key.tag = _STR_TAG
        return str(key.value)


def _count_distinct(root: Node) -> int:
    """How many nodes the document holds, each aliased node once."""
    seen: set[int] = set()
    pending = [root]
    while pending:
        node = pending.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, SequenceNode):
            pending.extend(node.value)
        elif isinstance(node, MappingNode):
            for key, value in node.value:
                pending += [key, value]
    return len(seen)


def _stream_entries(root: Node) -> dict[int, str]:
    """The ``streams`` entries of the document that have a plain ``name``, by node id, for the messages."""
    entries: dict[int, str] = {}
    if not isinstance(root, MappingNode):
        return entries
    for key, value in root.value:
        if not (isinstance(key, ScalarNode) and key.value == "streams" and isinstance(value, SequenceNode)):
            continue
        for entry in value.value:
            if not isinstance(entry, MappingNode):
                continue
            for entry_key, entry_value in entry.value:
                if (isinstance(entry_key, ScalarNode) and entry_key.value == "name"
                        and isinstance(entry_value, ScalarNode)):
                    entries[id(entry)] = entry_value.value
    return entries


def _one_line(error: yaml.YAMLError) -> str:
    """PyYAML's message (what, where, why on lines of their own) as the one line a refusal prints."""
    return "; ".join(line.strip() for line in str(error).splitlines() if line.strip())
