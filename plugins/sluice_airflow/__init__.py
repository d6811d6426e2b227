"""Sluice's Airflow extensions: the Spark submit hook, the stream operator and the DAG factory."""
