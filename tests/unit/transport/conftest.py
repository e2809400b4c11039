"""A channel server on loopback for the transport tests, and raw frames to it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq

from slurm_amoeba.transport.channel import ChannelServer


@pytest.fixture
def server(munged: None) -> Iterator[ChannelServer]:
    srv = ChannelServer("tcp://127.0.0.1:*")
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
