"""Authenticated request/reply over ZeroMQ: the wire between amoebactl, the daemon and the job agents.

Every request and every reply is two frames: a munge credential (:func:`slurm_amoeba.transport.munge.seal` over the
payload) and the payload, a versioned JSON message (:mod:`slurm_amoeba.core.messages`); never pickle. A server
(:class:`ChannelServer`, a ROUTER socket) hands out :class:`Request` objects that carry the sender's uid as munge
vouches for it; what cannot be authenticated or parsed is answered with a refusal and never reaches the caller.
:func:`request` sends one message and waits for its reply with a deadline and retries.

Each credential names where it goes and when it was sent. A request's destination is :func:`destination` of the
endpoint the sender connects to (``tcp port 6820``: the port, because a host has many names and addresses and the
server cannot know which one a client used); the server takes only credentials naming its own bound port, sent
within :data:`~slurm_amoeba.transport.munge.MAX_AGE_S`, and never the same credential twice (munged's replay cache
and the server's :class:`~slurm_amoeba.transport.munge.ReplayCache`). A reply's destination is ``reply <id>`` of the
request it answers, so that no reply (the daemon's, say) can be replayed as the answer to another request or as a
request.

The job agent serves directives with it; the daemon (a layer below in DESIGN.md's list) serves agents and
``amoebactl`` with the same code.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
import time
import uuid
from collections.abc import Sequence

import zmq

from slurm_amoeba.core.errors import AmoebaError
from slurm_amoeba.core.messages import MAX_MESSAGE_BYTES, Message, ProtocolError, decode, encode, quote
from slurm_amoeba.transport.munge import Credential, MungeError, ReplayCache, seal, unseal

logger = logging.getLogger(__name__)

MAX_FRAME = MAX_MESSAGE_BYTES + 8192
"""The largest frame a server takes: payload + credential; larger frames are dropped by ZeroMQ itself."""


class ChannelError(AmoebaError):
    """A request got no valid reply: timed out, refused, or the reply could not be authenticated.

    Attributes:
        unsigned: the request was never sent because munged did not sign it (munged down or restarting): a hiccup
            of this host, worth retrying, not a sign of the peer.
    """

    def __init__(self, message: str, *, unsigned: bool = False) -> None:
        super().__init__(message)
        self.unsigned = unsigned


@dataclasses.dataclass(frozen=True)
class Request:
    """A request that passed authentication and parsing.

    Attributes:
        sender: uid and gid of the process that sent it, as munge vouches.
        message: the decoded message.
        route: ZeroMQ routing frames to answer it with.
    """

    sender: Credential
    message: Message
    route: tuple[bytes, ...]


def destination(endpoint: str) -> str:
    """The name a credential gives its receiver: ``tcp port N`` for a TCP endpoint, the endpoint itself otherwise.

    Both ends derive it the same way: a sender from the endpoint it connects to, a server from the one it bound.
    """
    if endpoint.startswith("tcp://"):
        port = endpoint.rsplit(":", 1)[-1]
        if port.isdigit():
            return f"tcp port {int(port)}"
    return endpoint


def reply_destination(request_id: str) -> str:
    """The destination of the reply to the request with this id."""
    return f"reply {request_id[:200]}"


def frames_for(message: Message, to: str) -> list[bytes]:
    """The two frames (credential, payload) of ``message`` for the receiver named ``to`` (see :func:`destination`).

    Raises:
        ProtocolError: the message does not encode.
        MungeError: munged did not sign it.
    """
    payload = encode(message)
    return [seal(payload, to=to), payload]


def _open(frames: list[bytes], to: str, seen: ReplayCache | None = None) -> tuple[Credential, Message]:
    if len(frames) != 2:
        raise ProtocolError(f"expected 2 frames (credential, message), got {len(frames)}")
    cred, payload = frames
    sender = unseal(cred, payload, to=to)
    if seen is not None:
        seen.check(cred)
    return sender, decode(payload)


def refusal_reason(exc: Exception) -> str:
    """What the refusal of a request that failed its checks says: munge's or the parser's words, quoted and cut;
    for anything else a peer's bytes provoked, only the exception's type (never the bytes)."""
    if isinstance(exc, (MungeError, ProtocolError)):
        return quote(str(exc), 300)[1:-1]
    return f"unreadable message ({type(exc).__name__})"


def reply_payload(message: Message) -> bytes | None:
    """``message`` encoded; a reply too large or malformed becomes a reply that says so, which always fits; None
    (logged) when even that does not encode."""
    try:
        return encode(message)
    except ProtocolError as exc:
        logger.warning("[channel] could not encode the %s: %s", message.kind, exc)
        error = f"the answer could not be sent: {quote(str(exc), 200)[1:-1]}"
    try:
        return encode(Message("reply", {"ok": False, "error": error, "data": {}}, id=message.id))
    except ProtocolError as again:
        logger.warning("[channel] could not answer: %s", again)
        return None


def refusal_for(reason: str, body: Sequence[bytes]) -> Message:
    """The reply refusing a request whose frames after the routing envelope are ``body``, naming ``reason``."""
    return Message("reply", {"ok": False, "error": f"refused: {reason}", "data": {}}, id=_request_id(body))


def _request_id(body: Sequence[bytes]) -> str:
    """The id of a refused request when its payload is a readable message (its sender then gets a refusal it can
    read, e.g. that its credential was made for another port); a fresh id otherwise."""
    try:
        return decode(body[-1]).id if body else uuid.uuid4().hex
    except Exception:  # the payload is what was refused: no id to answer with
        return uuid.uuid4().hex


class RequestServer(abc.ABC):
    """What a daemon serves its requests with: :class:`ChannelServer`, or
    :class:`~slurm_amoeba.transport.front.FrontChannel` (its credentials checked in a process of its own). Both
    answer and refuse the same way (a refusal counted in :attr:`refusals` and logged); each receives and sends its
    own way.

    Attributes:
        endpoint: the endpoint bound.
        destination: the name requests' credentials must give (:func:`destination` of the endpoint).
        refusals: requests refused so far.
    """

    endpoint: str
    destination: str
    refusals: int

    @abc.abstractmethod
    def receive(self, timeout_s: float) -> Request | None:
        """Wait up to ``timeout_s`` for a valid request; None when none came."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop serving."""

    def answer(self, request: Request, reply: Message) -> None:
        """Send ``reply`` to the sender of ``request``."""
        self._send(request.route, reply)

    def refuse(self, request: Request, reason: str) -> None:
        """Answer ``request`` with a refusal naming ``reason``, and log it."""
        self.refusals += 1
        logger.warning("[channel] refused %s from uid %d: %s", request.message.kind, request.sender.uid, reason)
        self.answer(request, request.message.reply(ok=False, error=reason))

    @abc.abstractmethod
    def _send(self, route: tuple[bytes, ...], message: Message) -> None:
        """Sign ``message`` and send it along ``route``."""


class ChannelServer(RequestServer):
    """A ROUTER socket that authenticates every request.

    Args:
        endpoint: where to bind, e.g. ``tcp://0.0.0.0:6820`` or ``tcp://127.0.0.1:*`` (a free port).
        context: the ZeroMQ context (a new one when None).
    """

    def __init__(self, endpoint: str, context: zmq.Context[zmq.Socket[bytes]] | None = None) -> None:
        self._own_context = context is None
        self._context = context or zmq.Context()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME)
        self._socket.bind(endpoint)
        self.endpoint: str = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.destination = destination(self.endpoint)
        self.refusals = 0
        self._seen = ReplayCache()

    def receive(self, timeout_s: float) -> Request | None:
        """Wait up to ``timeout_s`` for a valid request.

        Invalid ones (bad credential, bad JSON, unknown kind, wrong version) are answered with a refusal, logged,
        counted in :attr:`refusals`, and skipped.

        Returns:
            The request, or None when none came in time.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._socket.poll(int(remaining * 1000)):
                return None
            frames = self._socket.recv_multipart()
            try:
                split = frames.index(b"")
            except ValueError:
                self.refusals += 1
                logger.warning("[daemon/channel] dropped a message without a routing envelope")
                continue
            route, body = tuple(frames[: split + 1]), frames[split + 1 :]
            try:
                sender, message = _open(body, self.destination, self._seen)
            except Exception as exc:  # anything a peer's bytes can provoke is a refusal, never the end of the loop
                reason = refusal_reason(exc)
            else:
                return Request(sender=sender, message=message, route=route)
            self.refusals += 1
            logger.warning("[channel] refused a message: %s", reason)
            self._send(route, refusal_for(reason, body))

    def _send(self, route: tuple[bytes, ...], message: Message) -> None:
        payload = reply_payload(message)
        if payload is None:
            return
        try:
            credential = seal(payload, to=reply_destination(message.id))
        except MungeError as exc:
            logger.warning("[channel] could not sign an answer: %s", exc)
            return
        try:
            self._socket.send_multipart([*route, credential, payload], flags=zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            logger.warning("[channel] could not answer: %s", exc)

    def close(self) -> None:
        """Close the socket (and the context when this server made it)."""
        self._socket.close(linger=0)
        if self._own_context:
            self._context.term()


def request(
    endpoint: str,
    message: Message,
    *,
    timeout_s: float = 5.0,
    retries: int = 2,
    expect_uid: int | None = None,
    context: zmq.Context[zmq.Socket[bytes]] | None = None,
) -> Message:
    """Send ``message`` to ``endpoint`` and return the reply (see :func:`request_from`).

    Raises:
        ChannelError: no reply after every attempt, or a reply that fails authentication.
    """
    return request_from(
        endpoint, message, timeout_s=timeout_s, retries=retries, expect_uid=expect_uid, context=context
    )[1]


def request_from(
    endpoint: str,
    message: Message,
    *,
    timeout_s: float = 5.0,
    retries: int = 2,
    expect_uid: int | None = None,
    context: zmq.Context[zmq.Socket[bytes]] | None = None,
) -> tuple[Credential, Message]:
    """Send ``message`` to ``endpoint``; return who answered (as munge vouches) and the reply.

    Each attempt uses a fresh socket, so a lost reply never wedges the next try. Requests should be idempotent
    (a retried resize to the same target is).

    Args:
        endpoint: the server, e.g. ``tcp://10.77.0.11:6820``.
        message: the request.
        timeout_s: deadline of one attempt.
        retries: further attempts after a timeout.
        expect_uid: when set, a reply must come from this uid.
        context: a ZeroMQ context to use (a shared one in long-lived processes).

    Returns:
        The replier's credential and the reply (``kind == "reply"``; check ``body["ok"]``).

    Raises:
        ChannelError: no reply after every attempt, a reply that fails authentication, a message that cannot be
            signed (munged not answering) or encoded, or an endpoint ZeroMQ cannot use.
    """
    ctx = context or zmq.Context.instance()
    last = ""
    for attempt in range(retries + 1):
        try:
            frames = frames_for(message, destination(endpoint))  # a fresh credential per attempt: no replays
        except MungeError as exc:
            raise ChannelError(f"{message.kind} to {endpoint} not sent: {exc}", unsigned=exc.unreachable) from None
        except ProtocolError as exc:
            raise ChannelError(f"{message.kind} to {endpoint} not sent: {exc}") from None
        sock = ctx.socket(zmq.REQ)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME)
        try:
            try:
                sock.connect(endpoint)
                sock.send_multipart(frames)
            except zmq.ZMQError as exc:
                raise ChannelError(f"{message.kind} to {endpoint} not sent: {exc}") from None
            if sock.poll(int(timeout_s * 1000)):
                try:
                    sender, reply = _open(sock.recv_multipart(), reply_destination(message.id))
                except (MungeError, ProtocolError) as exc:
                    raise ChannelError(f"the reply from {endpoint} could not be trusted: {exc}") from None
                except Exception as exc:
                    raise ChannelError(f"the reply from {endpoint} is unreadable ({type(exc).__name__})") from None
                if expect_uid is not None and sender.uid != expect_uid:
                    raise ChannelError(f"the reply from {endpoint} came from uid {sender.uid}, expected {expect_uid}")
                if reply.kind != "reply" or reply.id != message.id:
                    raise ChannelError(f"{endpoint} answered {reply.kind} {reply.id}, not the reply to {message.id}")
                return sender, reply
            last = f"no reply within {timeout_s:g} s"
            logger.info("[channel] %s to %s: %s (attempt %d)", message.kind, endpoint, last, attempt + 1)
        finally:
            sock.close(linger=0)
    raise ChannelError(f"{message.kind} to {endpoint} failed: {last} after {retries + 1} attempts; is it running?")
