"""Whether the driver can load a class (sluice_spark.session.missing_classes), where Spark's own quick test cannot
answer. Py4J's view of the JVM is stubbed here: no jar on this machine is half present, and the real JVM's answers
are tested in tests/spark/test_expectations.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from sluice_spark.session import missing_classes


def driver(class_is_loadable: Any, for_name: Any) -> Any:
    lang = SimpleNamespace(Class=SimpleNamespace(forName=for_name), Thread=SimpleNamespace(
        currentThread=lambda: SimpleNamespace(getContextClassLoader=lambda: None)))
    spark_utils = SimpleNamespace(Utils=SimpleNamespace(classIsLoadable=class_is_loadable))
    jvm = SimpleNamespace(org=SimpleNamespace(apache=SimpleNamespace(spark=SimpleNamespace(util=spark_utils))),
                          java=SimpleNamespace(lang=lang))
    return SimpleNamespace(sparkContext=SimpleNamespace(_jvm=jvm))


def test_a_class_that_cannot_link_counts_as_missing() -> None:
    """Spark's classIsLoadable lets a LinkageError through (a jar built for another Scala, or one whose superclass is
    absent); the JVM is then asked directly, and a class that does not link is missing, as one that is not there."""
    def links_badly(name: str) -> bool:
        raise RuntimeError(f"java.lang.NoClassDefFoundError: {name}")

    def for_name(name: str, initialize: bool, loader: Any) -> object:
        if name == "org.example.Broken":
            raise RuntimeError(f"java.lang.NoClassDefFoundError: {name}")
        return object()

    assert missing_classes(driver(links_badly, for_name), ["org.example.Broken", "org.example.Fine"]) == [
        "org.example.Broken"]
    answers = {"org.example.There": True, "org.example.Absent": False}
    assert missing_classes(driver(answers.__getitem__, for_name), list(answers)) == ["org.example.Absent"]
