"""The production stack's files, checked without Docker: docker-compose.yaml, the Dockerfiles and .env.example.

No Docker engine runs in CI, so these tests read the files the way compose and docker build would: the YAML with its
anchors and merge keys, the ``${VAR...}`` substitutions against .env.example, the paths against the repository, and
the Dockerfiles' pins against requirements.txt. The hardening checks read them the same way: published ports bind
the loopback, Kafka takes SASL clients only (with the credentials the connection carries), no Spark UI can kill,
every image is pinned by digest, and no image leaves /etc/passwd writable.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from sluice.operations import jvm

PROJECT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = PROJECT / "docker-compose.yaml"
# Warm mode's override file: docker compose -f docker-compose.yaml -f docker-compose.warm.yaml up
WARM_FILE = PROJECT / "docker-compose.warm.yaml"
# The object-storage profile: docker compose -f docker-compose.yaml -f docker-compose.object-storage.yaml up
OBJECT_STORAGE_FILE = PROJECT / "docker-compose.object-storage.yaml"
ENV_EXAMPLE = PROJECT / ".env.example"
DOCKER_DIR = PROJECT / "include" / "docker"
AIRFLOW_DOCKERFILE = DOCKER_DIR / "airflow.Dockerfile"
SPARK_DOCKERFILE = DOCKER_DIR / "spark.Dockerfile"
DOCKERFILES = (AIRFLOW_DOCKERFILE, SPARK_DOCKERFILE)
SPARK_DEFAULTS = DOCKER_DIR / "spark-defaults.conf"

AIRFLOW_SERVICES = {"airflow-init", "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor",
                    "airflow-triggerer"}
SPARK_SERVICES = {"spark-master", "spark-worker"}
EXPECTED_SERVICES = AIRFLOW_SERVICES | SPARK_SERVICES | {"postgres", "kafka", "producer", "landing-producer"}
# Runs once and exits; every other service runs until stopped and must have a healthcheck.
ONE_SHOT_SERVICES = {"airflow-init"}
DATA_MOUNT = "/opt/sluice/data"
SECRET_NAME = re.compile(r"PASSWORD|SECRET|FERNET")
# Settings that hold a secret themselves (a setting that names a file of secrets does not).
SECRET_SETTING = re.compile(r"(PASSWORD|SECRET|SECRET_KEY|FERNET_KEY)$")
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
LOOPBACK = "127.0.0.1"
BIND_VARIABLE = "SLUICE_BIND_ADDRESS"
# name:tag@sha256:<64 hex>: the tag says what it is, the digest makes it immutable.
PINNED_IMAGE = re.compile(r"[a-z0-9][a-z0-9._/-]*:[\w][\w.-]*@sha256:[0-9a-f]{64}")
KILL_DISABLED = "-Dspark.ui.killEnabled=false"
SPARK_CONF_DIR = "/opt/spark/conf"

# `$$` is compose's escape for a literal `$` (left to the container's shell); anything else starting with `$` is
# substituted by compose: `${NAME}`, `${NAME:-default}`, `${NAME-default}`, `${NAME:?error}`, `${NAME?error}`,
# `${NAME:+alt}` and bare `$NAME`.
SUBSTITUTION = re.compile(r"\$(?:\$|\{(?P<name>\w+)(?P<op>:?[-?+])?(?P<arg>[^}]*)\}|(?P<bare>[A-Za-z_]\w*))")


def compose_text() -> str:
    return COMPOSE_FILE.read_text(encoding="utf-8")


def load_compose() -> dict[str, Any]:
    document = yaml.safe_load(compose_text())
    assert isinstance(document, dict), "docker-compose.yaml must be a mapping"
    return document


def services() -> dict[str, dict[str, Any]]:
    return dict(load_compose()["services"])


def scalars(node: object) -> list[str]:
    """Every string value of a loaded YAML document: what compose interpolates (comments are gone by then)."""
    if isinstance(node, dict):
        return [text for value in node.values() for text in scalars(value)]
    if isinstance(node, list):
        return [text for value in node for text in scalars(value)]
    return [node] if isinstance(node, str) else []


def substitutions(document: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    """(name, operator) of every substitution compose makes; the operator is '' when there is none."""
    found = []
    for text in scalars(document if document is not None else load_compose()):
        for match in SUBSTITUTION.finditer(text):
            if match.group("name"):
                found.append((match.group("name"), match.group("op") or ""))
            elif match.group("bare"):
                found.append((match.group("bare"), ""))
    return found


def env_example() -> dict[str, str]:
    values = {}
    for line in ENV_EXAMPLE.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, separator, value = line.partition("=")
            assert separator, f".env.example: {line!r} is not KEY=VALUE"
            values[key.strip()] = value.strip()
    return values


def with_defaults(value: str) -> str:
    """``value`` as compose resolves it when no variable is set: defaults in, everything else empty."""
    return interpolate(value, {})


def interpolate(value: str, variables: dict[str, str]) -> str:
    """``value`` as compose resolves it with ``variables`` set (as in .env) and every other variable unset."""
    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group("name") or match.group("bare")
        op = match.group("op") or ""
        if name in variables and (variables[name] or not op.startswith(":")):
            return match.group("arg") if op.endswith("+") else variables[name]
        return match.group("arg") if op in (":-", "-") else ""

    return SUBSTITUTION.sub(replace, value)


def volume_source_and_target(entry: str | dict[str, Any]) -> tuple[str, str]:
    if isinstance(entry, dict):
        return str(entry["source"]), str(entry["target"])
    source, _, rest = with_defaults(entry).partition(":")
    return source, rest.split(":")[0]


def is_bind(source: str) -> bool:
    return source.startswith((".", "/", "~"))


def requirement_pins() -> dict[str, str]:
    pins = {}
    for line in (PROJECT / "requirements.txt").read_text(encoding="utf-8").splitlines():
        if "==" in line and not line.startswith("#"):
            name, _, pinned = line.partition("==")
            pins[re.sub(r"[-_.]+", "-", name.strip().lower())] = pinned.strip()
    return pins


def dockerfile_from(path: Path) -> str:
    images = re.findall(r"^FROM\s+(\S+)", path.read_text(encoding="utf-8"), flags=re.MULTILINE)
    assert len(images) == 1, f"{path.name}: expected one FROM, found {images}"
    return images[0]


def dockerfile_instructions(path: Path) -> list[str]:
    """The Dockerfile's instructions, one string each: continuation lines joined, comments dropped."""
    instructions: list[str] = []
    pending = ""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("#"):
            continue
        pending += line.rstrip().removesuffix("\\") + " "
        if not line.rstrip().endswith("\\"):
            if pending.strip():
                instructions.append(" ".join(pending.split()))
            pending = ""
    return instructions


def published_ports(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(host address as written, as resolved with the defaults) of each of a service's published ports."""
    found = []
    for entry in service.get("ports", []):
        if isinstance(entry, dict):  # the long syntax; no host_ip means every interface
            written = str(entry.get("host_ip", ""))
        else:
            # host_ip:host_port:container_port, split at the colons outside ${...}; fewer parts publish on every
            # interface.
            parts = re.findall(r"(?:\$\{[^}]*\}|[^:])+", str(entry))
            written = ":".join(parts[:-2])
        found.append((written, with_defaults(written)))
    return found


def listeners(setting: str) -> dict[str, str]:
    """A Kafka listener list (``NAME://host:port,...``) by name."""
    return dict(listener.split("://", 1) for listener in setting.split(","))


def jaas_users(jaas_config: str) -> dict[str, str]:
    """The users (``user_<name>="<password>"``) a PlainLoginModule JAAS configuration accepts."""
    return dict(re.findall(r'\buser_(\w+)="([^"]*)"', jaas_config))


def test_compose_parses_with_its_anchors_and_merge_keys() -> None:
    document = load_compose()
    assert set(document["services"]) == EXPECTED_SERVICES
    common_env = document["x-airflow-common"]["environment"]
    for name in AIRFLOW_SERVICES:
        service = document["services"][name]
        assert service["image"] == document["x-airflow-common"]["image"], name
        missing = set(common_env) - set(service["environment"])
        assert not missing, f"{name} lacks the common Airflow environment: {sorted(missing)}"


def test_every_service_has_a_healthcheck_or_is_a_one_shot_that_others_wait_for() -> None:
    defined = services()
    for name, service in defined.items():
        if name in ONE_SHOT_SERVICES:
            assert service.get("restart", "no") == "no", f"{name} runs once: a restart policy would rerun it"
            waiting = {other: spec["depends_on"][name]["condition"] for other, spec in defined.items()
                       if isinstance(spec.get("depends_on"), dict) and name in spec["depends_on"]}
            assert waiting, f"nothing waits for the one-shot {name}"
            assert set(waiting.values()) == {"service_completed_successfully"}, waiting
            continue
        check = service.get("healthcheck")
        assert check, f"{name} has no healthcheck"
        assert not check.get("disable") and check.get("test") not in (None, [], ["NONE"]), f"{name}: {check}"


def test_depends_on_names_defined_services_with_conditions_they_can_meet() -> None:
    defined = services()
    for name, service in defined.items():
        depends_on = service.get("depends_on", {})
        assert isinstance(depends_on, dict), f"{name}: use the long form of depends_on, with a condition"
        for target, spec in depends_on.items():
            assert target in defined, f"{name} depends on undefined service {target!r}"
            condition = spec["condition"]
            assert condition in CONDITIONS, f"{name} -> {target}: unknown condition {condition!r}"
            if condition == "service_healthy":
                assert "healthcheck" in defined[target], f"{name} waits for {target} to be healthy; it has no check"
            if condition == "service_completed_successfully":
                assert target in ONE_SHOT_SERVICES, f"{name} waits for {target} to exit, but it runs until stopped"


def test_build_contexts_and_dockerfiles_exist() -> None:
    built = {name: service["build"] for name, service in services().items() if "build" in service}
    assert {"airflow-scheduler", "spark-master", "producer"} <= set(built)
    for name, build in built.items():
        context = (COMPOSE_FILE.parent / build["context"]).resolve()
        assert context.is_dir(), f"{name}: build context {build['context']} does not exist"
        dockerfile = context / build.get("dockerfile", "Dockerfile")
        assert dockerfile.is_file(), f"{name}: {dockerfile} does not exist"
        assert dockerfile.is_relative_to(DOCKER_DIR), f"{name}: Dockerfiles live under include/docker"


def test_bind_mounts_exist_in_the_repository_or_are_data_created_at_run_time() -> None:
    declared_volumes = set(load_compose().get("volumes") or {})
    data = PROJECT / "data"
    for name, service in services().items():
        for entry in service.get("volumes", []):
            source, target = volume_source_and_target(entry)
            if not is_bind(source):
                assert source in declared_volumes, f"{name}: named volume {source!r} is not declared"
                continue
            assert not source.startswith(("/", "~")), f"{name}: {source} is a path of one machine"
            path = (COMPOSE_FILE.parent / source).resolve()
            # ./data is created at run time (by `make run` or by compose) and is git-ignored, so it may be absent.
            assert path.exists() or path.is_relative_to(data), f"{name}: bind mount {source} -> {target} is missing"
    assert "data/" in (PROJECT / ".gitignore").read_text().splitlines(), "./data must stay out of git"


def test_every_variable_is_defaulted_or_listed_in_env_example() -> None:
    listed = set(env_example())
    used = substitutions() + [found for override in (WARM_FILE, OBJECT_STORAGE_FILE)
                              for found in substitutions(yaml.safe_load(override.read_text(encoding="utf-8")))]
    assert used, "the compose file substitutes no variable at all"
    undocumented = {name for name, op in used if op not in (":-", "-") and name not in listed}
    assert not undocumented, f"set in neither a default nor .env.example: {sorted(undocumented)}"
    stale = listed - {name for name, _ in used}
    assert not stale, f".env.example lists variables the compose file does not use: {sorted(stale)}"


def test_secrets_are_required_variables_never_defaults() -> None:
    used = substitutions()
    secrets = {name for name, _ in used if SECRET_NAME.search(name)}
    assert {"POSTGRES_PASSWORD", "AIRFLOW_ADMIN_PASSWORD", "AIRFLOW_FERNET_KEY", "AIRFLOW_JWT_SECRET",
            "AIRFLOW_API_SECRET_KEY", "SLUICE_KAFKA_PASSWORD", "KAFKA_BROKER_PASSWORD"} <= secrets
    defaulted = {(name, op) for name, op in used if name in secrets and op != ":?"}
    assert not defaulted, f"a secret needs ${{NAME:?...}}, not a default: {sorted(defaulted)}"
    for name, service in services().items():
        for key, value in (service.get("environment") or {}).items():
            if SECRET_SETTING.search(key) or key.endswith("SQL_ALCHEMY_CONN"):
                assert any(secret in str(value) for secret in secrets) and ":?" in str(value), (
                    f"{name}: {key} must come from a required .env variable, not a literal")


def test_env_example_holds_no_secret_values_and_env_stays_out_of_git_and_images() -> None:
    values = env_example()
    required = {name for name, op in substitutions() if op in (":?", "?")}
    assert required <= set(values), f"required but not in .env.example: {sorted(required - set(values))}"
    filled = {key: value for key, value in values.items() if SECRET_NAME.search(key) and value}
    assert not filled, f".env.example must leave secrets empty: {sorted(filled)}"
    assert ".env" in (PROJECT / ".gitignore").read_text().splitlines()
    assert ".env" in (PROJECT / ".dockerignore").read_text().splitlines()


def test_airflow_services_share_the_x_airflow_common_anchor() -> None:
    root = yaml.compose(compose_text())
    top = {key.value: value for key, value in root.value}
    common = top["x-airflow-common"]
    common_env = next(value for key, value in common.value if key.value == "environment")
    service_nodes = {key.value: value for key, value in top["services"].value}
    for name in AIRFLOW_SERVICES:
        merges = [value for key, value in service_nodes[name].value if key.value == "<<"]
        assert any(node is common for node in merges), f"{name} does not merge <<: *airflow-common"
        own_env = [value for key, value in service_nodes[name].value if key.value == "environment"]
        for environment in own_env:  # a service that adds variables must merge the common ones in
            env_merges = [value for key, value in environment.value if key.value == "<<"]
            assert any(node is common_env for node in env_merges), f"{name} drops *airflow-common-env"


def test_data_is_mounted_at_one_path_in_the_airflow_and_spark_containers() -> None:
    defined = services()
    sources = {}
    for name in AIRFLOW_SERVICES | SPARK_SERVICES | {"landing-producer"}:
        mounts = dict(volume_source_and_target(entry)[::-1] for entry in defined[name].get("volumes", []))
        assert DATA_MOUNT in mounts, f"{name} does not mount the data at {DATA_MOUNT}"
        sources[name] = mounts[DATA_MOUNT]
    assert len(set(sources.values())) == 1, f"one data folder for all: {sources}"
    environment = defined["airflow-scheduler"]["environment"]
    for root in ("SLUICE_DATA_ROOT", "SLUICE_LANDING_ROOT", "SLUICE_LAKE_ROOT", "SLUICE_CHECKPOINT_ROOT"):
        assert environment[root].startswith(DATA_MOUNT), f"{root}={environment[root]} is outside the shared mount"
    assert defined["landing-producer"]["environment"]["SLUICE_LANDING_ROOT"] == environment["SLUICE_LANDING_ROOT"]


def test_spark_connection_resolves_to_the_compose_master_in_client_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice_airflow.hooks import SluiceSparkSubmitHook
    from sluice_airflow.operators import DEFAULT_SPARK_CONN_ID

    defined = services()
    scheduler = defined["airflow-scheduler"]["environment"]
    variable = f"AIRFLOW_CONN_{DEFAULT_SPARK_CONN_ID.upper()}"
    assert variable in scheduler, f"the scheduler (where the driver runs) lacks {variable}"
    monkeypatch.setenv(variable, scheduler[variable])
    connection = SluiceSparkSubmitHook(conn_id=DEFAULT_SPARK_CONN_ID)._connection
    master = defined["spark-master"]["environment"]
    assert connection["master"] == f"spark://{master['SPARK_MASTER_HOST']}:{master['SPARK_MASTER_PORT']}"
    assert connection["deploy_mode"] == "client"
    assert defined["spark-worker"]["environment"]["SPARK_MASTER_URL"] == connection["master"]
    assert master["SPARK_MASTER_HOST"] in defined, "the master's host must be its service name (Docker DNS)"


def test_driver_advertises_a_name_the_executors_can_resolve() -> None:
    scheduler = services()["airflow-scheduler"]
    driver_host = scheduler["environment"]["SPARK_LOCAL_HOSTNAME"]
    assert driver_host == scheduler["hostname"] == "airflow-scheduler"
    assert driver_host in services(), "Docker's DNS resolves service names for the workers"


def test_kafka_connection_and_producer_point_at_the_kraft_broker() -> None:
    defined = services()
    broker = defined["kafka"]["environment"]
    assert set(broker["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    # The controller listens on the container's loopback only, and the node votes for itself there.
    controller = listeners(broker["KAFKA_LISTENERS"])[broker["KAFKA_CONTROLLER_LISTENER_NAMES"]]
    assert controller.startswith("localhost:"), f"the KRaft controller listens on {controller}"
    assert broker["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"{broker['KAFKA_NODE_ID']}@{controller}"
    advertised = listeners(broker["KAFKA_ADVERTISED_LISTENERS"])
    assert broker["KAFKA_CONTROLLER_LISTENER_NAMES"] not in advertised
    internal = advertised[broker["KAFKA_INTER_BROKER_LISTENER_NAME"]]
    connection = json.loads(defined["airflow-scheduler"]["environment"]["AIRFLOW_CONN_SLUICE_KAFKA"])
    assert connection["conn_type"] == "kafka"
    assert connection["extra"]["bootstrap.servers"] == internal
    assert defined["producer"]["environment"]["KAFKA_BOOTSTRAP_SERVERS"] == internal
    assert defined["airflow-scheduler"]["environment"]["KAFKA_BOOTSTRAP_SERVERS"] == internal
    assert "--topic" in defined["producer"]["command"], "the producer writes to Kafka, not to files"


def test_image_pins_match_requirements() -> None:
    pins = requirement_pins()
    airflow_image = dockerfile_from(AIRFLOW_DOCKERFILE)
    spark_image = dockerfile_from(SPARK_DOCKERFILE)
    found = re.fullmatch(r"apache/airflow:(?P<airflow>[\d.]+)-python(?P<python>3\.\d+)@sha256:[0-9a-f]{64}",
                         airflow_image)
    assert found, ("airflow.Dockerfile must build FROM apache/airflow:<version>-python<x.y>@sha256:<digest>, "
                   f"not {airflow_image}")
    assert found["airflow"] == pins["apache-airflow"] == pins["apache-airflow-core"]
    assert spark_image.startswith(f"python:{found['python']}-"), (
        f"the executors' Python ({spark_image}) must be the driver's ({found['python']})")
    for path in (AIRFLOW_DOCKERFILE, SPARK_DOCKERFILE):
        text = path.read_text(encoding="utf-8")
        assert "-r /opt/sluice/requirements.txt" in text, f"{path.name} must install requirements.txt"


# --- hardening ------------------------------------------------------------------------------------------------


def test_every_published_port_binds_the_loopback_unless_env_says_otherwise() -> None:
    published = {name: published_ports(service) for name, service in services().items() if service.get("ports")}
    assert {"airflow-apiserver", "spark-master", "kafka"} <= set(published)
    for name, ports in published.items():
        for written, resolved in ports:
            assert resolved == LOOPBACK, f"{name} publishes a port on {resolved or 'every interface'}"
            assert written in (LOOPBACK, f"${{{BIND_VARIABLE}:-{LOOPBACK}}}"), (
                f"{name}: bind to {LOOPBACK} or ${{{BIND_VARIABLE}:-{LOOPBACK}}}, not {written!r}")
    assert env_example()[BIND_VARIABLE] == LOOPBACK, ".env.example must show the loopback default"


def test_kafka_takes_sasl_clients_only_and_the_connection_carries_the_credentials() -> None:
    from sluice.connections.kafka import ConnectionFields, client_config, spark_options

    defined = services()
    broker = defined["kafka"]["environment"]
    protocols = dict(entry.split(":") for entry in broker["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    bound = listeners(broker["KAFKA_LISTENERS"])
    controller = broker["KAFKA_CONTROLLER_LISTENER_NAMES"]
    # The host-facing listener is the one behind the published port.
    published = {str(entry).rsplit(":", 1)[-1] for entry in defined["kafka"]["ports"]}
    external = [name for name, address in bound.items() if address.rsplit(":", 1)[-1] in published]
    assert external == ["EXTERNAL"], f"the published port reaches {external}"
    for name in bound:
        if name == controller:  # on the container's loopback only (checked above), never advertised
            assert bound[name].startswith("localhost:")
            continue
        assert protocols[name] in ("SASL_PLAINTEXT", "SASL_SSL"), f"Kafka's {name} listener is {protocols[name]}"
    assert broker["KAFKA_SASL_ENABLED_MECHANISMS"] == "PLAIN"

    # The connection, as compose resolves it from .env, logs in as a user that both client listeners accept.
    secrets = {"SLUICE_KAFKA_PASSWORD": "0123456789abcdef", "KAFKA_BROKER_PASSWORD": "fedcba9876543210"}
    raw_connection = defined["airflow-scheduler"]["environment"]["AIRFLOW_CONN_SLUICE_KAFKA"]
    spec = json.loads(interpolate(raw_connection, secrets))
    connection = ConnectionFields("sluice_kafka", login=spec.get("login"), password=spec.get("password"),
                                  extra=spec["extra"])
    options = spark_options(connection)
    assert options["kafka.security.protocol"] == protocols["INTERNAL"]
    assert options["kafka.sasl.mechanism"] == "PLAIN"
    assert f'password="{secrets["SLUICE_KAFKA_PASSWORD"]}"' in options["kafka.sasl.jaas.config"]
    probe = client_config(connection)
    for name in ("INTERNAL", "EXTERNAL"):
        jaas = interpolate(broker[f"KAFKA_LISTENER_NAME_{name}_PLAIN_SASL_JAAS_CONFIG"], secrets)
        assert jaas_users(jaas).get(probe["sasl.username"]) == probe["sasl.password"], (
            f"the {name} listener does not accept the connection's user {probe['sasl.username']!r}")
    internal_jaas = interpolate(broker["KAFKA_LISTENER_NAME_INTERNAL_PLAIN_SASL_JAAS_CONFIG"], secrets)
    broker_login = dict(re.findall(r'\b(username|password)="([^"]*)"', internal_jaas))
    assert jaas_users(internal_jaas).get(broker_login["username"]) == broker_login["password"], (
        "the broker's own inter-broker login must be a user of INTERNAL")
    # The demo producer logs in with the very same connection.
    producer = defined["producer"]
    assert producer["environment"]["AIRFLOW_CONN_SLUICE_KAFKA"] == raw_connection
    assert producer["command"][:6] == ["python", "-m", "sluice", "demo-producer", "--kafka-connection", "sluice_kafka"]
    assert "--command-config" in " ".join(defined["kafka"]["healthcheck"]["test"]), "the healthcheck logs in too"


def test_the_demo_producer_and_its_admin_client_log_in_with_the_connection(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The stack's producer command, run with its environment: the topic is created and the events are sent with
    the connection's SASL settings (the broker is faked: there is none here)."""
    import confluent_kafka
    import confluent_kafka.admin

    from sluice.cli import demo_producer

    producer_service = services()["producer"]
    raw = producer_service["environment"]["AIRFLOW_CONN_SLUICE_KAFKA"]
    monkeypatch.setenv("AIRFLOW_CONN_SLUICE_KAFKA", interpolate(raw, {"SLUICE_KAFKA_PASSWORD": "0123456789abcdef"}))
    security = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": "sluice",
                "sasl.password": "0123456789abcdef"}
    configs: dict[str, dict[str, Any]] = {}

    class FakeAdmin:
        def __init__(self, config: dict[str, Any]) -> None:
            configs["admin"] = config

        def list_topics(self, timeout: float) -> Any:
            return type("Metadata", (), {"topics": {}})()

        def create_topics(self, topics: list[Any]) -> dict[str, Any]:
            return {topic.topic: type("Done", (), {"result": lambda self, timeout: None})() for topic in topics}

    class FakeProducer:
        def __init__(self, config: dict[str, Any]) -> None:
            configs["producer"] = config

        def produce(self, topic: str, value: Any = None, key: Any = None, on_delivery: Any = None, **_: Any) -> None:
            if on_delivery is not None:
                on_delivery(None, None)

        def poll(self, timeout: float = 0) -> int:
            return 0

        def flush(self, timeout: float = 0) -> int:
            return 0

    monkeypatch.setattr(confluent_kafka.admin, "AdminClient", FakeAdmin)
    monkeypatch.setattr(confluent_kafka, "Producer", FakeProducer)
    command = [str(with_defaults(part)) for part in producer_service["command"][4:]]
    command = [part for part in command if part != "--loop"]
    if "--heartbeat-file" in command:
        position = command.index("--heartbeat-file")
        del command[position:position + 2]
    demo_producer.main([*command, "--files", "1", "--lines", "3"])
    assert configs["admin"] == {"bootstrap.servers": "kafka:9092", **security}
    assert security.items() <= configs["producer"].items() and configs["producer"]["acks"] == "all"


def test_no_spark_ui_can_kill_applications_or_drivers() -> None:
    defined = services()
    assert KILL_DISABLED in defined["spark-master"]["environment"]["SPARK_MASTER_OPTS"].split()
    assert KILL_DISABLED in defined["spark-worker"]["environment"]["SPARK_WORKER_OPTS"].split()
    # Applications (drivers in the scheduler, executors in the workers) read the images' spark-defaults.conf.
    settings = dict(line.split(None, 1) for line in SPARK_DEFAULTS.read_text(encoding="utf-8").splitlines()
                    if line.strip() and not line.lstrip().startswith("#"))
    assert settings.get("spark.ui.killEnabled", "").strip() == "false"
    for path in DOCKERFILES:
        instructions = dockerfile_instructions(path)
        assert f"COPY include/docker/{SPARK_DEFAULTS.name} {SPARK_CONF_DIR}/spark-defaults.conf" in instructions, (
            f"{path.name} does not install {SPARK_DEFAULTS.name}")
        assert any(re.match(rf"ENV .*\bSPARK_CONF_DIR={re.escape(SPARK_CONF_DIR)}(\s|$)", instruction)
                   for instruction in instructions), f"{path.name} does not set SPARK_CONF_DIR={SPARK_CONF_DIR}"


def test_every_image_is_pinned_by_tag_and_digest() -> None:
    for name, service in services().items():
        image = with_defaults(str(service["image"]))
        if "build" in service:  # the local name of an image built from a pinned FROM, checked below
            continue
        assert PINNED_IMAGE.fullmatch(image), f"{name}: pin {image} as name:tag@sha256:<digest>"
    for path in DOCKERFILES:
        image = dockerfile_from(path)
        assert PINNED_IMAGE.fullmatch(image), f"{path.name}: FROM {image} needs name:tag@sha256:<digest>"


def test_no_image_leaves_etc_passwd_writable() -> None:
    for path in DOCKERFILES:
        for instruction in dockerfile_instructions(path):
            for mode in re.findall(r"\bchmod\s+(?:-\w+\s+)*(\S+)[^;&|]*?/etc/passwd\b", instruction):
                # Only taking write permission away is allowed (the Airflow base image grants it to group 0).
                assert re.fullmatch(r"[ugoa]*-[rwx]*w[rwx]*", mode), f"{path.name}: chmod {mode} /etc/passwd"
            assert not re.search(r">>?\s*/etc/passwd\b", instruction), f"{path.name} writes /etc/passwd"
    base_image_chmod = dockerfile_instructions(AIRFLOW_DOCKERFILE)
    assert any(re.search(r"\bchmod go-w /etc/passwd\b", instruction) for instruction in base_image_chmod), (
        "airflow.Dockerfile must take back the base image's group write on /etc/passwd")
    entrypoint = (DOCKER_DIR / "spark-entrypoint.sh").read_text(encoding="utf-8")
    assert not re.search(r">>?\s*/etc/passwd", entrypoint), "the Spark entrypoint must not write /etc/passwd"
    # The images create the user the containers run as, at build time: same UID in the build args and in `user:`.
    for name, service in services().items():
        if "build" not in service:
            continue
        build_uid = with_defaults(str(service["build"].get("args", {}).get("SLUICE_UID", "")))
        run_uid = with_defaults(str(service.get("user", ""))).split(":")[0]
        assert build_uid and (build_uid == run_uid or service.get("user") == "0:0"), (
            f"{name}: built for UID {build_uid or '(none)'}, runs as {run_uid}")
        assert service["build"]["args"]["SLUICE_UID"] == "${AIRFLOW_UID:-50000}", name
    for path in DOCKERFILES:
        text = path.read_text(encoding="utf-8")
        assert re.search(r"^ARG SLUICE_UID=\d+$", text, flags=re.MULTILINE), f"{path.name} lacks ARG SLUICE_UID"
        assert 'useradd --uid "${SLUICE_UID}"' in text, f"{path.name} does not create the user at build time"


def test_the_warm_override_adds_a_warm_server_and_points_the_run_tasks_at_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice.warm import WarmAddress
    from sluice_airflow.hooks import warm_address

    warm = yaml.safe_load(WARM_FILE.read_text(encoding="utf-8"))
    base = services()
    assert set(warm["services"]) == {"sluice-warm"} | (AIRFLOW_SERVICES - {"airflow-init"})
    server = warm["services"]["sluice-warm"]
    assert server["image"] == load_compose()["x-airflow-common"]["image"]
    assert "ports" not in server, "the warm server takes runs on the compose network only"
    assert "sluice warm ping" in " ".join(server["healthcheck"]["test"])
    assert server["depends_on"] == {name: {"condition": "service_healthy"} for name in SPARK_SERVICES}
    # The image's entrypoint would run the command as `airflow spark-submit ...`; the server keeps cores for the rest.
    assert server["entrypoint"] == ["/usr/bin/dumb-init", "--"] and server["command"][0] == "spark-submit"
    cores = with_defaults(server["command"][server["command"].index("--conf") + 1])
    worker_cores = int(with_defaults(base["spark-worker"]["environment"]["SPARK_WORKER_CORES"]))
    assert cores == "spark.cores.max=1" and worker_cores > 1, "a cold run must find a core the server leaves free"
    assert warm["services"]["airflow-scheduler"]["depends_on"] == {"sluice-warm": {"condition": "service_healthy"}}
    assert server["environment"]["SPARK_LOCAL_HOSTNAME"] == "sluice-warm"
    command = server["command"]

    def option(name: str) -> str:
        return str(command[command.index(name) + 1])

    assert (PROJECT / option("--catalog").removeprefix("/opt/sluice/")).is_file()
    log_config = option("--driver-java-options").removeprefix("-Dlog4j2.configurationFile=file:/opt/sluice/")
    assert PROJECT / log_config == jvm.LOG_CONFIG, "the warm server's Spark log is Sluice's, at WARN"
    assert any(PROJECT / str(part).removeprefix("/opt/sluice/") == PROJECT / "spark_apps" / "warm_server.py"
               for part in command)
    scheduler_env = base["airflow-scheduler"]["environment"]
    for flag, root in (("--landing-root", "SLUICE_LANDING_ROOT"), ("--lake-root", "SLUICE_LAKE_ROOT"),
                       ("--checkpoint-root", "SLUICE_CHECKPOINT_ROOT")):
        assert option(flag) == scheduler_env[root], f"the server must serve the run tasks' {root}"
    assert server["environment"]["AIRFLOW_CONN_SLUICE_KAFKA"] == scheduler_env["AIRFLOW_CONN_SLUICE_KAFKA"]

    # The token is a required secret, and the connection every Airflow service gets carries it to that port.
    found = substitutions(warm)
    assert {op for name, op in found if name == "SLUICE_WARM_SECRET"} == {":?"}
    assert "SLUICE_WARM_SECRET" in env_example() and not env_example()["SLUICE_WARM_SECRET"]
    secret = "s" * 40
    assert interpolate(server["environment"]["SLUICE_WARM_TOKEN"], {"SLUICE_WARM_SECRET": secret}) == secret
    for name in AIRFLOW_SERVICES - {"airflow-init"}:
        connection = interpolate(warm["services"][name]["environment"]["AIRFLOW_CONN_SLUICE_WARM"],
                                 {"SLUICE_WARM_SECRET": secret})
        monkeypatch.setenv("AIRFLOW_CONN_SLUICE_WARM", connection)
        assert warm_address("sluice_warm") == WarmAddress("sluice-warm", int(option("--port")), secret), name


def test_the_object_storage_override_puts_the_lake_on_its_store_with_the_connections_credentials() -> None:
    from sluice.connections.storage import storage_environment
    from sluice.storage.store import is_local

    profile = yaml.safe_load(OBJECT_STORAGE_FILE.read_text(encoding="utf-8"))
    served = AIRFLOW_SERVICES - {"airflow-init"}
    assert set(profile["services"]) == {"object-storage", "object-storage-init", "spark-worker"} | served
    store, init = profile["services"]["object-storage"], profile["services"]["object-storage-init"]
    for service in (store, init):
        assert PINNED_IMAGE.fullmatch(with_defaults(str(service["image"]))), "pin the store as name:tag@sha256"
    assert [written for written, _ in published_ports(store)] == [f"${{{BIND_VARIABLE}:-{LOOPBACK}}}"]
    assert store["healthcheck"]["test"] and init["depends_on"] == {"object-storage": {"condition": "service_healthy"}}
    command = " ".join(store["command"])
    port = re.search(r"-s3\.port=(\d+)", command)
    assert port and "-s3.config=" in command and "$$SLUICE_S3_SECRET_KEY" in command
    assert "s3.bucket.create -name sluice" in " ".join(init["command"])

    # Two required secrets; every service that needs them gets them from .env, never a default.
    found = substitutions(profile)
    for secret in ("SLUICE_S3_ACCESS_KEY", "SLUICE_S3_SECRET_KEY"):
        assert {op for name, op in found if name == secret} == {":?"}
        assert secret in env_example() and not env_example()[secret]
    secrets = {"SLUICE_S3_ACCESS_KEY": "a" * 20, "SLUICE_S3_SECRET_KEY": "s" * 40}

    # The lake moves to the store's bucket; the landing zone and the checkpoints stay on the shared mount.
    base_env = services()["airflow-scheduler"]["environment"]
    for name in served:
        env = {key: interpolate(str(value), secrets) for key, value in profile["services"][name]["environment"].items()}
        assert env["SLUICE_LAKE_ROOT"] == "s3://sluice/lake" and not is_local(env["SLUICE_LAKE_ROOT"])
        assert "SLUICE_CHECKPOINT_ROOT" not in env and is_local(base_env["SLUICE_CHECKPOINT_ROOT"])
        connection = json.loads(env["AIRFLOW_CONN_SLUICE_STORAGE"])
        assert (connection["login"], connection["password"]) == (secrets["SLUICE_S3_ACCESS_KEY"],
                                                                 secrets["SLUICE_S3_SECRET_KEY"])
    # The executors write the tables' files: the workers' environment is what the connection gives the driver.
    given = storage_environment(connection["conn_type"], login=connection["login"], password=connection["password"],
                                extra=connection["extra"])
    assert given["AWS_ENDPOINT_URL"] == f"http://object-storage:{port.group(1)}"
    for name in ("spark-worker", "airflow-apiserver"):  # the executors; the Streams page's reads of the run log
        env = {key: interpolate(str(value), secrets) for key, value in profile["services"][name]["environment"].items()}
        assert {key: value for key, value in env.items() if key.startswith("AWS_")} == given, name
    assert profile["services"]["airflow-scheduler"]["depends_on"] == {
        "object-storage-init": {"condition": "service_completed_successfully"}}


def test_make_run_compose_and_the_cost_bench_give_the_scheduler_one_idle_sleep() -> None:
    """The scheduler's sleep between idle loops is a deployment choice (docs/performance/cost.md): the embedded
    default, the compose stack (and the .env it is copied to) and the bench that times a DAG run through a scheduler
    make one."""
    setting = "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME"
    makefile = re.search(rf"^export {setting} \?= (\S+)$", (PROJECT / "Makefile").read_text(encoding="utf-8"), re.M)
    composed = SUBSTITUTION.fullmatch(str(load_compose()["x-airflow-common"]["environment"].get(setting, "")))
    bench = re.search(r'^SCHEDULER_IDLE_SLEEP_TIME = "(\S+)"$',
                      (PROJECT / "bench" / "bench_run_cost.py").read_text(encoding="utf-8"), re.M)
    assert makefile and composed and bench, "the setting is missing from the Makefile, the compose file or the bench"
    assert composed["op"] == ":-", "compose must default the setting, so that .env may change it"
    values = {"Makefile": makefile[1], "docker-compose.yaml": composed["arg"], "bench": bench[1],
              ".env.example": env_example().get(composed["name"])}
    assert len(set(values.values())) == 1, values
    assert 0 < float(makefile[1]) < 1, "Airflow's default is 1 s; Sluice's is shorter (docs/performance/cost.md)"
