"""A server's front process: the credentials checked and the replies signed in a process of its own.

A busy daemon spends most of each request on munge: the loop thread waits for munged to check the request's
credential and again to sign the reply (about 0.1 ms each on a quiet host, most of it munged's), and threads cannot
overlap those waits with the daemon's own work, which holds the interpreter's lock. :class:`FrontChannel` moves them
into a child process (``python -m slurm_amoeba.transport.front``) that owns the public socket:

- the front binds the endpoint (a ROUTER socket, as :class:`~slurm_amoeba.transport.channel.ChannelServer`),
  checks each request's credential exactly as the channel does (munge, the destination, the age, the replay cache)
  and answers what fails with the same refusal; what passes goes to the server process with the uid and gid munge
  vouches for, over a private socket (``ipc://`` in a directory only the server's user can enter);
- the server process decodes each message, refuses what does not parse (a refusal the front signs), and answers
  through the front, which signs every reply for the request it answers and sends it;
- the front hands the server at most :data:`WINDOW` requests ahead of what the server says it took; the rest wait
  in the public socket, which takes turns between its peers, so that a burst of one user's reports (or the backlog
  of a long round) does not queue ahead of another peer's ``amoebactl status`` in the private queue.

The two processes share no memory and pass only bytes (the message as it came, JSON; no pickle). The front ends
within a second of its server's process (it checks its parent every second: ``PR_SET_PDEATHSIG`` would end it with
the *thread* that started it); a front that died is started again on the same endpoint by the server's next
:meth:`FrontChannel.receive`, at most once a second. The server sees the
same interface as :class:`~slurm_amoeba.transport.channel.ChannelServer` (both are a
:class:`~slurm_amoeba.transport.channel.RequestServer`).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

import zmq

from slurm_amoeba.core.messages import Message, ProtocolError, decode, encode
from slurm_amoeba.transport.channel import (
    MAX_FRAME,
    Request,
    RequestServer,
    destination,
    refusal_for,
    refusal_reason,
    reply_destination,
    reply_payload,
)
from slurm_amoeba.transport.munge import Credential, MungeError, ReplayCache, seal, unseal

logger = logging.getLogger(__name__)

#: Seconds the server waits for a new front to bind its endpoint.
START_TIMEOUT_S = 15.0
#: Seconds between two starts of a front that keeps dying.
RESTART_EVERY_S = 1.0
#: Messages the front reads from one side before it looks at the other.
BURST = 64
#: Messages either process may queue for the other (ZeroMQ's high-water mark, 1,000 by default, would drop the
#: replies of a burst while the front is busy checking requests).
QUEUE = 100_000
#: Requests the front hands the server ahead of what it took. The rest wait in the public socket, which takes turns
#: between its peers: one user's burst of reports does not queue ahead of another's ``amoebactl status``, as it
#: would in the one private queue.
WINDOW = 64
#: The server says what it took at least every this many requests (and whenever it has taken all it was handed).
CREDIT_EVERY = WINDOW // 4

# Frames between the two processes (the first frame names the kind; the route comes last, as ZeroMQ gave it).
_READY = b"ready"  # front -> server: [ready, bound endpoint] or [failed, reason]
_FAILED = b"failed"
_REQUEST = b"request"  # front -> server: [request, uid, gid, sent_at, payload, *route]
_REFUSED = b"refused"  # front -> server: [refused]: one request refused (counted in the server's refusals)
_ANSWER = b"answer"  # server -> front: [answer, reply id, payload, *route]
_TOOK = b"took"  # server -> front: [took, count]: requests the server took off its queue
_STOP = b"stop"  # server -> front: [stop]


class FrontError(RuntimeError):
    """The front process could not start or bind its endpoint."""


class FrontChannel(RequestServer):
    """A :class:`~slurm_amoeba.transport.channel.ChannelServer` whose credential checks and reply signing run in a
    front process (see the module).

    Args:
        endpoint: where the front binds, e.g. ``tcp://0.0.0.0:6820`` or ``tcp://127.0.0.1:*`` (a free port: a
            front started again binds the port the first one got).
        python: the interpreter that runs the front.

    Raises:
        FrontError: the front did not start and bind within :data:`START_TIMEOUT_S` (its reason, e.g. the address
            in use).
    """

    def __init__(self, endpoint: str, *, python: str = sys.executable) -> None:
        self._python = python
        self._dir = tempfile.mkdtemp(prefix="amoeba-front-")  # mode 0700: only this user reaches the socket
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._back = self._context.socket(zmq.PAIR)
        self.refusals = 0
        self.starts = 0
        self._taken = 0  # requests taken since the server last said so
        self._process: subprocess.Popen[bytes] | None = None
        self._last_start = 0.0
        try:
            self.endpoint: str = self._start(endpoint)
        except BaseException:
            self._release()
            raise
        self.destination = destination(self.endpoint)

    def _start(self, endpoint: str) -> str:
        """Start a front on ``endpoint`` and return the endpoint it bound.

        Each front gets a private socket of its own (``back-N``): a pair socket keeps talking to the peer it had,
        and a front that died leaves its peer behind."""
        self._last_start = time.monotonic()
        self.starts += 1
        self._taken = 0
        self._back.close(linger=0)
        self._back = self._context.socket(zmq.PAIR)
        self._back.setsockopt(zmq.LINGER, 0)
        self._back.setsockopt(zmq.SNDHWM, QUEUE)
        self._back.setsockopt(zmq.RCVHWM, QUEUE)
        back = f"ipc://{self._dir}/back-{self.starts}"
        self._back.bind(back)
        argv = [self._python, "-m", "slurm_amoeba.transport.front", "--listen", endpoint, "--back", back]
        self._process = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        if not self._back.poll(int(START_TIMEOUT_S * 1000)):
            self._stop_process()
            raise FrontError(f"the front process did not bind {endpoint} within {START_TIMEOUT_S:g} s")
        kind, text = self._back.recv_multipart()
        if kind != _READY:
            self._stop_process()
            raise FrontError(f"the front process could not bind {endpoint}: {text.decode(errors='replace')}")
        return text.decode()

    @property
    def pid(self) -> int | None:
        """The front process's pid (None while none runs)."""
        return self._process.pid if self._process is not None else None

    def alive(self) -> bool:
        """Whether the front process runs."""
        return self._process is not None and self._process.poll() is None

    def _revive(self) -> None:
        """Start the front again when it died (at most once per :data:`RESTART_EVERY_S`)."""
        if self.alive() or time.monotonic() - self._last_start < RESTART_EVERY_S:
            return
        code = self._process.returncode if self._process is not None else None
        logger.error("[channel] the front process ended (exit status %s); starting it again on %s", code, self.endpoint)
        try:
            self._start(self.endpoint)
        except FrontError as exc:
            logger.error("[channel] %s; trying again in %g s", exc, RESTART_EVERY_S)

    def receive(self, timeout_s: float) -> Request | None:
        """Wait up to ``timeout_s`` for a valid request (see :meth:`ChannelServer.receive`).

        Returns:
            The request, or None when none came in time.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            self._revive()
            if self._taken and (self._taken >= CREDIT_EVERY or not self._back.poll(0)):
                self._say_taken()
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._back.poll(int(min(remaining, RESTART_EVERY_S) * 1000)):
                if time.monotonic() >= deadline:
                    return None
                continue
            frames = self._back.recv_multipart()
            if frames[0] == _REFUSED:
                self.refusals += 1
                continue
            if frames[0] != _REQUEST or len(frames) < 6:
                continue  # a front of another version: nothing to answer
            self._taken += 1
            uid, gid, sent_at, payload = frames[1:5]
            route = tuple(frames[5:])
            try:
                message = decode(payload)
            except Exception as exc:  # anything a peer's bytes can provoke is a refusal, never the end of the loop
                reason = refusal_reason(exc)
            else:
                sender = Credential(uid=int(uid), gid=int(gid), sent_at=float(sent_at))
                return Request(sender=sender, message=message, route=route)
            self.refusals += 1
            logger.warning("[channel] refused a message: %s", reason)
            refusal = refusal_for(reason, [payload])
            self._send(route, refusal)

    def _say_taken(self) -> None:
        """Tell the front how many requests were taken, so that it hands on as many more (see :data:`WINDOW`)."""
        try:
            self._back.send_multipart([_TOOK, str(self._taken).encode()], flags=zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            logger.warning("[channel] could not tell the front process what was taken: %s", exc)
            return
        self._taken = 0

    def _send(self, route: tuple[bytes, ...], message: Message) -> None:
        """Hand ``message`` to the front, which signs and sends it."""
        payload = reply_payload(message)
        if payload is None:
            return
        try:
            self._back.send_multipart([_ANSWER, message.id.encode(), payload, *route], flags=zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            logger.warning("[channel] could not hand an answer to the front process: %s", exc)

    def _stop_process(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(zmq.ZMQError):
                self._back.send_multipart([_STOP], flags=zmq.NOBLOCK)
            try:
                process.wait(2.0)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(2.0)

    def _release(self) -> None:
        self._stop_process()
        self._back.close(linger=0)
        self._context.term()
        shutil.rmtree(self._dir, ignore_errors=True)

    def close(self) -> None:
        """Stop the front (it sends the replies it was handed first) and close the private socket."""
        self._release()


# ----------------------------------------------------------------------------------------------- the front process


class _Front:
    """The front process's loop: the public ROUTER socket on one side, the server's private socket on the other."""

    def __init__(self, listen: str, back: str) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.back = self.context.socket(zmq.PAIR)
        self.back.setsockopt(zmq.LINGER, 2000)
        self.back.setsockopt(zmq.SNDHWM, QUEUE)
        self.back.setsockopt(zmq.RCVHWM, QUEUE)
        self.back.connect(back)
        self.router = self.context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME)
        self.listen = listen
        self.seen = ReplayCache()
        self.parent = os.getppid()
        self.handed = 0  # requests handed to the server and not yet taken by it

    def bind(self) -> bool:
        try:
            self.router.bind(self.listen)
        except zmq.ZMQError as exc:
            self.back.send_multipart([_FAILED, str(exc).encode()])
            return False
        bound = self.router.getsockopt_string(zmq.LAST_ENDPOINT)
        self.destination = destination(bound)
        self.back.send_multipart([_READY, bound.encode()])
        return True

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self.back, zmq.POLLIN)
        while os.getppid() == self.parent:
            poller.modify(self.router, zmq.POLLIN if self.handed < WINDOW else 0)
            ready = dict(poller.poll(1000))
            if self.back in ready and not self._from_server():
                return
            if self.router in ready:
                self._from_clients()

    def _from_server(self) -> bool:
        """Sign and send the server's answers; False when it said stop."""
        for _ in range(BURST):
            try:
                frames = self.back.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return True
            if frames[0] == _STOP:
                return False
            if frames[0] == _TOOK and len(frames) == 2 and frames[1].isdigit():
                self.handed = max(0, self.handed - int(frames[1]))
                continue
            if frames[0] == _ANSWER and len(frames) >= 4:
                reply_id, payload, route = frames[1].decode(errors="replace"), frames[2], frames[3:]
                self._send(route, payload, reply_id)
        return True

    def _send(self, route: Sequence[bytes], payload: bytes, reply_id: str) -> None:
        try:
            credential = seal(payload, to=reply_destination(reply_id))
        except MungeError as exc:
            logger.warning("[channel] could not sign an answer: %s", exc)
            return
        try:
            self.router.send_multipart([*route, credential, payload], flags=zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            logger.warning("[channel] could not answer: %s", exc)

    def _from_clients(self) -> None:
        """Check each request's credential: pass it to the server (up to :data:`WINDOW` ahead), or refuse it."""
        for _ in range(BURST):
            if self.handed >= WINDOW:
                return
            try:
                frames = self.router.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                split = frames.index(b"")
            except ValueError:
                self.back.send_multipart([_REFUSED])
                logger.warning("[channel] dropped a message without a routing envelope")
                continue
            route, body = frames[: split + 1], frames[split + 1 :]
            try:
                if len(body) != 2:
                    raise ProtocolError(f"expected 2 frames (credential, message), got {len(body)}")
                sender = unseal(body[0], body[1], to=self.destination)
                self.seen.check(body[0])
            except Exception as exc:  # anything a peer's bytes can provoke is a refusal, never the end of the loop
                reason = refusal_reason(exc)
            else:
                ids = (str(sender.uid).encode(), str(sender.gid).encode(), repr(sender.sent_at).encode())
                self.back.send_multipart([_REQUEST, *ids, body[1], *route])
                self.handed += 1
                continue
            self.back.send_multipart([_REFUSED])
            logger.warning("[channel] refused a message: %s", reason)
            refusal = refusal_for(reason, body)
            self._send(route, encode(refusal), refusal.id)

    def close(self) -> None:
        self.router.close(linger=0)
        self.back.close()
        self.context.term()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m slurm_amoeba.transport.front --listen ENDPOINT --back ipc://...``: run a front until its server
    says stop or ends."""
    parser = argparse.ArgumentParser(prog="slurm_amoeba.transport.front", description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", required=True, help="the public endpoint to bind")
    parser.add_argument("--back", required=True, help="the server's private endpoint")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s", stream=sys.stderr)
    front = _Front(args.listen, args.back)
    try:
        if front.bind():
            front.run()
    finally:
        front.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
