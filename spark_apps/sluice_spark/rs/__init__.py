"""The delta-rs engine on the Spark side: a Python data source that reads a Delta table as a stream and writes
micro-batches into Delta tables with delta-rs, once per batch."""
