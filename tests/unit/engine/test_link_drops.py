"""EngineLink's log of dropped bus connections, over real ipc sockets: a worker that said Goodbye closes its
connection as expected (INFO); a peer that vanishes without one is worth a WARNING. Both are counted."""

from __future__ import annotations

import logging
import os
import time

import pytest
from helpers.bus_peers import bus_config, short_runtime_dir

from detok_worker.bus.codec import encode
from detok_worker.bus.messages import Goodbye, Hello
from detok_worker.bus.sockets import BusSockets
from detok_worker.engine.link import EngineLink

LOGGER = "detok_worker.engine.link"


def poll_for(link: EngineLink, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        link.poll(0.02)


def drops_logged(link: EngineLink, caplog: pytest.LogCaptureFixture, count: int) -> list[logging.LogRecord]:
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and link.dropped_connections < count:
        link.poll(0.02)
    assert link.dropped_connections == count
    return [record for record in caplog.records if "connection(s) dropped" in record.getMessage()]


def test_a_goodbye_makes_the_drop_expected_and_a_vanished_peer_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    with short_runtime_dir() as runtime_dir:
        config = bus_config(runtime_dir, **{"engine.stats_interval_s": 0.05})
        link = EngineLink(config)
        try:
            with BusSockets(config) as peers:
                leaving = peers.worker_dealer("w-leaving")
                leaving.send(encode(Hello("w-leaving", os.getpid())))
                leaving.send(encode(Goodbye("w-leaving")))
                poll_for(link, 0.3)  # Hello and Goodbye are taken before the connection closes
                leaving.close(linger=0)
                records = drops_logged(link, caplog, 1)
                assert [record.levelno for record in records] == [logging.INFO]

                vanishing = peers.worker_dealer("w-vanishing")
                vanishing.send(encode(Hello("w-vanishing", os.getpid())))
                poll_for(link, 0.3)
                assert "w-vanishing" in link.scheduler.worker_loads()
                vanishing.close(linger=0)
                records = drops_logged(link, caplog, 2)
                assert [record.levelno for record in records] == [logging.INFO, logging.WARNING]
        finally:
            link.close()
