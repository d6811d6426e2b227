"""What Sluice reads and writes outside Spark: Spark's checkpoint files, the stream lock, Delta tables' logs and
the landing zone."""
