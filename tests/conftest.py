"""Root conftest: loads the real-parts plugin (tests/fixtures/plugin.py) for every suite.

Fixtures it provides: kube, control_plane, redis_server, fresh_redis,
redis_server_factory, postgres_server, postgres_db. See docs/control-plane.md.
"""

pytest_plugins = ["fixtures.plugin"]
