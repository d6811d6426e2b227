"""What a Spark driver that Sluice starts opens to the network: on a local master, nothing beyond loopback.

A local-master driver listens for its RPC and its block manager on the machine's own address (Spark's default for
``spark.driver.host``) and for its UI on every address (``SPARK_LOCAL_IP`` unset), without authentication: anyone who
reaches the machine could read the UI or talk to the driver. Nothing outside the machine needs them, since the
executors run in the driver's own JVM, so every launcher (the operators' hook, `make run`'s warm server, the command
line's training run) gives them :func:`driver_conf` and :func:`driver_env`, and the apps keep to them when started by
hand (:func:`sluice_spark.session.loopback_driver`). A deployment that wants the UI on another address says so with
``SLUICE_SPARK_UI_ADDRESS`` (for example ``0.0.0.0``); the RPC and the block manager stay on loopback. A cluster master
(``spark://``, ``k8s://``, ``yarn``) keeps the addresses its executors connect back to. No UI can kill a job or a stage
on any master (``spark.ui.killEnabled=false``): stop a run from Airflow.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping

from sluice.errors import SluiceError

LOOPBACK = "127.0.0.1"
UI_ADDRESS_ENV = "SLUICE_SPARK_UI_ADDRESS"
# Spark's own variable: the address its web UI binds to (WebUI reads only the environment for it).
SPARK_LOCAL_IP = "SPARK_LOCAL_IP"
KILL_ENABLED = "spark.ui.killEnabled"
LOCAL_ADDRESSES = ("spark.driver.bindAddress", "spark.driver.host")


def is_local(master: str | None) -> bool:
    """Whether ``master`` runs the executors inside the driver (``local``, ``local[*]``, ``local-cluster[...]``)."""
    return (master or "").strip().startswith("local")


def driver_conf(master: str | None) -> dict[str, str]:
    """The Spark settings a driver on ``master`` gets unless its task sets them itself."""
    conf = {KILL_ENABLED: "false"}
    if is_local(master):
        conf.update(dict.fromkeys(LOCAL_ADDRESSES, LOOPBACK))
    return conf


def driver_env(master: str | None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a driver on ``master`` gets: its UI's address on a local master (``SLUICE_SPARK_UI_ADDRESS``,
    loopback by default). Raises :class:`SluiceError` for a value that is not an IP address."""
    if not is_local(master):
        return {}
    address = (os.environ if environ is None else environ).get(UI_ADDRESS_ENV) or LOOPBACK
    try:
        ipaddress.ip_address(address)
    except ValueError:
        raise SluiceError(f"{UI_ADDRESS_ENV}: the address the Spark UI listens on is an IP address (127.0.0.1, "
                          f"0.0.0.0, ...), got {address!r}") from None
    return {SPARK_LOCAL_IP: address}


def submit_args(master: str | None, given: Mapping[str, str] | None = None) -> list[str]:
    """:func:`driver_conf` as spark-submit's ``--conf`` arguments, leaving out what ``given`` sets."""
    return [part for key, value in driver_conf(master).items() if key not in (given or {})
            for part in ("--conf", f"{key}={value}")]


def is_loopback(address: str) -> bool:
    """Whether a socket's address is the machine's own (an IPv4 address mapped into IPv6 included)."""
    parsed = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        parsed = parsed.ipv4_mapped
    return parsed.is_loopback
