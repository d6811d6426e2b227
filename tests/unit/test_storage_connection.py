"""Object-storage credentials from Airflow connections, mapped to the environment every reader of the store takes."""

from __future__ import annotations

import json

import pytest

from sluice.connections.storage import described, secrets_of, storage_environment
from sluice.errors import SluiceError


def test_an_aws_connection_with_an_s3_compatible_endpoint() -> None:
    env = storage_environment("aws", login="AKIA1", password="s3cr3t", extra=json.dumps({
        "region_name": "eu-west-1", "endpoint_url": "http://minio:9000", "aws_session_token": "tok"}))
    assert env == {"AWS_ACCESS_KEY_ID": "AKIA1", "AWS_SECRET_ACCESS_KEY": "s3cr3t", "AWS_SESSION_TOKEN": "tok",
                   "AWS_REGION": "eu-west-1", "AWS_ENDPOINT_URL": "http://minio:9000", "AWS_ALLOW_HTTP": "true",
                   "AWS_CONDITIONAL_PUT": "etag"}
    assert sorted(secrets_of(env)) == ["s3cr3t", "tok"]
    assert "s3cr3t" not in json.dumps(described(env)) and described(env)["AWS_ACCESS_KEY_ID"] == "AKIA1"


def test_an_aws_connection_without_keys_leaves_the_machine_its_role() -> None:
    env = storage_environment("aws", extra={"region_name": "us-east-1"})
    assert env == {"AWS_REGION": "us-east-1", "AWS_CONDITIONAL_PUT": "etag"}


def test_azure_and_google_connections() -> None:
    assert storage_environment("wasb", login="account", password="key==") == {
        "AZURE_STORAGE_ACCOUNT_NAME": "account", "AZURE_STORAGE_ACCOUNT_KEY": "key=="}
    principal = storage_environment("adls", login="account", extra={"tenant_id": "t", "client_id": "c",
                                                                     "client_secret": "cs"})
    assert secrets_of(principal) == ["cs"] and principal["AZURE_TENANT_ID"] == "t"
    assert storage_environment("google_cloud_platform", extra={"key_path": "/keys/sa.json"}) == {
        "GOOGLE_SERVICE_ACCOUNT": "/keys/sa.json", "GOOGLE_APPLICATION_CREDENTIALS": "/keys/sa.json"}
    inline = storage_environment("google_cloud_platform", extra={"keyfile_dict": {"private_key": "pk"}})
    assert secrets_of(inline) == ['{"private_key": "pk"}']


def test_other_connection_types_and_bad_extras_are_refused() -> None:
    with pytest.raises(SluiceError, match="not 'postgres'"):
        storage_environment("postgres")
    with pytest.raises(SluiceError, match="not a JSON object"):
        storage_environment("aws", extra="[1]")
