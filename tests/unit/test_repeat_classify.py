"""Which failures count as a lost reply (``agent_saga._repeat.lost_reply``): only those
after which the request may have run, so that a repeat is the store's decision. The
repeating itself is tested against real servers (tests/integration/test_redis_repeats.py)."""

from __future__ import annotations

import pytest
import redis.exceptions as rex
from agent_saga._redis import LazyCluster
from agent_saga._repeat import check_retries, lost_reply, repeat_bound
from agent_saga.errors import ConfigurationError


def test_a_closed_connection_a_timeout_and_a_vanished_socket_are_lost_replies() -> None:
    assert lost_reply(rex.ConnectionError("Connection closed by server.")) == (
        "the connection closed before the reply came")
    assert lost_reply(rex.ConnectionError("Error UNKNOWN while writing to socket. Connection lost.")) is not None
    assert lost_reply(rex.TimeoutError("Timeout reading from socket")) == "no reply within the socket timeout"
    assert lost_reply(TimeoutError()) == "no reply within the socket timeout"
    assert lost_reply(AttributeError("'NoneType' object has no attribute 'writelines'")) == (
        "the client closed it to re-read the cluster's topology")


def test_a_failed_connect_a_server_error_and_a_bug_are_not_lost_replies() -> None:
    assert lost_reply(rex.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")) is None
    assert lost_reply(rex.TimeoutError("Timeout connecting to server")) is None
    assert lost_reply(rex.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value")) is None
    assert lost_reply(rex.ClusterError("TTL exhausted.")) is None
    assert lost_reply(AttributeError("'Claim' object has no attribute 'tokn'")) is None
    assert lost_reply(ValueError("x")) is None


def test_the_default_bound_is_3_on_a_cluster_and_1_elsewhere_and_retries_wins() -> None:
    cluster = LazyCluster(lambda: None)
    assert repeat_bound(None, cluster) == 3
    assert repeat_bound(None, object()) == 1
    assert repeat_bound(0, cluster) == 0 and repeat_bound(5, object()) == 5
    assert check_retries(None) is None and check_retries(2) == 2
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ConfigurationError, match=r"retries must be >= 0 \(or None for the default\)"):
            check_retries(bad)  # type: ignore[arg-type]


def test_the_first_repeat_is_at_once_and_later_ones_wait_longer_up_to_a_cap() -> None:
    from agent_saga._repeat import repeat_delay

    assert [repeat_delay(n) for n in range(1, 7)] == [0.0, 0.05, 0.1, 0.2, 0.25, 0.25]
