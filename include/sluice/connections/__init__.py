"""The Airflow connections Sluice's streams use, and the secrets they carry."""
