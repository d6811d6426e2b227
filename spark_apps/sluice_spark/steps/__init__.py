"""The steps between a source and its sink: the quality split, the transform, the patterns and the routing of
rows to their tables."""
