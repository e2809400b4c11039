"""A channel server on loopback for the transport tests (each test that takes one runs twice: against the server
that checks credentials on its own thread, and against the one whose front process does), and raw frames to it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq

from slurm_amoeba.transport.channel import ChannelServer, RequestServer
from slurm_amoeba.transport.front import FrontChannel


@pytest.fixture(params=["in-process", "front-process"])
def server(munged: None, request: pytest.FixtureRequest) -> Iterator[RequestServer]:
    srv: RequestServer = (
        ChannelServer("tcp://127.0.0.1:*") if request.param == "in-process" else FrontChannel("tcp://127.0.0.1:*")
    )
    try:
        yield srv
    finally:
        srv.close()


def send_raw(endpoint: str, frames: list[bytes]) -> list[bytes]:
    """Send ``frames`` on a REQ socket and return the answer's frames (fails the test when none comes in 5 s)."""
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        sock.send_multipart(frames)
        assert sock.poll(5000), "no answer came back"
        return list(sock.recv_multipart())
    finally:
        sock.close(linger=0)
