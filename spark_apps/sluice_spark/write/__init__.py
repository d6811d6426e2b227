"""The write path: the ``foreachBatch`` router that splits a routed micro-batch over its tables, and the Delta
table writers of each engine."""
