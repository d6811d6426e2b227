"""What is done to a stream's state besides running it: the health gate, repair, backfill planning, and the status
report."""
