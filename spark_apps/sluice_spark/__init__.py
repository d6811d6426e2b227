"""Sluice's Spark side: sources, quality split, transforms, Delta sinks and the stream runner.

Imported only inside Spark applications and Spark tests; nothing on the Airflow side imports it.
"""
