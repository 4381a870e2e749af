"""Session-scoped fixtures that more than one tests/e2e module uses, registered once here.

A session-scoped fixture that two test modules each import is two fixtures to pytest, each set up once for the
module that imported it: two Spark and two Flink clusters (tests/engines_clusters.py) and two FnApiRunner
references, each held to the session's end. Registered here they
are set up once (tests/unit/house/test_session_fixtures.py keeps test modules from importing them).
"""
from tests.engines_clusters import engines_reference, flink_cluster, spark_cluster  # noqa: F401
