"""Schema drift in Spark: what a record holds that its declared schema does not read, in JSON, CSV and Parquet
files and typed sources, and the columns ``add_new_columns`` adds."""
