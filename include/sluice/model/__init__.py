"""What a catalog declares, as frozen dataclasses: one stream (:mod:`~sluice.model.stream`), the base of its source
and sink (:mod:`~sluice.model.sources`, :mod:`~sluice.model.sinks`; each kind in :mod:`sluice.kinds` subclasses
them), its schema, its patterns, its transform's contract, and the typed section reader every parser uses.
No I/O here."""
