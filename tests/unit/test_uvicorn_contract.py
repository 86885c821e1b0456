"""The HTTP edge's contract with uvicorn's internals (issue 32 part 5).

reconciler/adapters/controller/server.py sets what uvicorn's documented settings cover through them, and puts
the routes' body limits in a Starlette middleware; the head deadline, the head limits, the connection caps,
lingering close and the inline answer to worker reports need the httptools protocol itself, so `EdgeProtocol`
subclasses `uvicorn.protocols.http.httptools_impl.HttpToolsProtocol` and drives its `RequestResponseCycle`.
pyproject pins uvicorn to the minor release this was tested with. These tests fail, naming what moved, when an
upgrade changes what the edge relies on: the version, the methods it overrides or calls (with their
parameters), the cycle's state it reads and sets, and a request and a worker report through the real protocol
class on an in-memory transport. Before moving the pin: run tests/integration/test_controller_edge.py,
test_controller_inline.py, test_controller_http.py and test_hostile_workers.py, then update TESTED_MINOR.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from pathlib import Path
from typing import Any

import uvicorn
from uvicorn.config import Config
from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from reconciler.adapters.controller.server import ControllerServer, EdgeLimits, _edge_protocol
from reconciler.adapters.store.sqlite import SqliteStore
from tests.controller_support import ADMIN, SECRET, auth, register_doc

TESTED_MINOR = (0, 55)

#: Methods of HttpToolsProtocol the edge overrides or calls, with their parameters.
PROTOCOL_METHODS = {
    "__init__": ["self", "config", "server_state", "app_state", "_loop"],
    "connection_made": ["self", "transport"],
    "connection_lost": ["self", "exc"],
    "eof_received": ["self"],
    "data_received": ["self", "data"],
    "on_message_begin": ["self"],
    "on_url": ["self", "url"],
    "on_header": ["self", "name", "value"],
    "on_headers_complete": ["self"],
    "on_response_complete": ["self"],
    "_start_asgi_task": ["self", "cycle", "app"],
    "_unset_keepalive_if_required": ["self"],
    "send_400_response": ["self", "msg"],
}
#: Instance state of the protocol the edge reads (set by HttpToolsProtocol.__init__/connection_made).
PROTOCOL_STATE = ("parser", "cycle", "pipeline", "client", "loop", "scope", "flow", "transport")
#: State of a RequestResponseCycle the edge reads or sets (its inline answer finishes a cycle as `send` does).
CYCLE_STATE = ("scope", "body", "more_body", "response_started", "response_complete", "keep_alive",
               "waiting_for_100_continue", "default_headers", "message_event", "disconnected", "on_response")


def test_uvicorn_is_the_minor_release_the_edge_was_tested_with() -> None:
    minor = tuple(int(part) for part in uvicorn.__version__.split(".")[:2])
    assert minor == TESTED_MINOR, (
        f"uvicorn {uvicorn.__version__} is installed; the HTTP edge (controller/server.py) subclasses its internals "
        f"and was tested with {TESTED_MINOR[0]}.{TESTED_MINOR[1]}: run the edge tests named in this module's "
        "docstring, then move TESTED_MINOR and the pin in pyproject.toml together")


def test_the_protocol_methods_the_edge_overrides_and_calls_keep_their_parameters() -> None:
    for name, parameters in PROTOCOL_METHODS.items():
        method = getattr(HttpToolsProtocol, name, None)
        assert method is not None, f"HttpToolsProtocol.{name} is gone (controller/server.py overrides or calls it)"
        assert list(inspect.signature(method).parameters) == parameters, \
            f"HttpToolsProtocol.{name}{inspect.signature(method)} changed (the edge expects {parameters})"
    assert set(STATUS_LINE) >= {200, 400, 408, 413, 431, 500}
    assert STATUS_LINE[200] == b"HTTP/1.1 200 OK\r\n"


def test_the_cycle_keeps_the_state_the_edge_reads_and_sets() -> None:
    source = inspect.getsource(RequestResponseCycle.__init__)
    for name in CYCLE_STATE:
        assert f"self.{name} =" in source, f"RequestResponseCycle no longer sets {name} (the edge uses it)"
    protocol_source = inspect.getsource(HttpToolsProtocol)
    for name in PROTOCOL_STATE:
        assert f"self.{name} =" in protocol_source or f"self.{name}:" in protocol_source, \
            f"HttpToolsProtocol no longer sets {name} (the edge uses it)"
    # The edge closes over the parser's own module: httptools' exceptions and its parser as uvicorn makes it.
    assert httptools_impl.httptools.HttpRequestParser is not None


class MemoryTransport(asyncio.Transport):
    """A connection in memory: what the server writes is kept; it closes when the server closes it."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.9", 40000), "sockname": ("127.0.0.1", 8080)}.get(name, default)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def can_write_eof(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _answers(written: bytes) -> list[tuple[int, dict[str, Any]]]:
    out = []
    while written:
        head, _, rest = written.partition(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(
            b"content-length:"))
        out.append((int(head.split(b" ")[1]), json.loads(rest[:length])))
        written = rest[length:]
    return out


def test_requests_through_the_real_protocol_class_on_a_memory_transport(tmp_path: Path) -> None:
    """A health check (the ASGI path) and a worker's registration (the inline path) through the edge's protocol
    as uvicorn builds it, without a socket: if uvicorn changed how a request reaches `_start_asgi_task` or how a
    cycle is answered, the answers are wrong or missing here."""
    store = SqliteStore(tmp_path / "c.db")
    server = ControllerServer(store, SECRET, ADMIN, limits=EdgeLimits())
    protocol_class, guard = _edge_protocol(EdgeLimits(), (server.api, server.commits))
    loop = asyncio.new_event_loop()
    try:
        config = Config(server.app, http=protocol_class, loop="asyncio", lifespan="off", log_config=None)
        protocol = protocol_class(config=config, server_state=ServerState(), app_state={}, _loop=loop)
        transport = MemoryTransport()
        body = json.dumps(register_doc("p-0-memory")).encode()
        headers = "".join(f"{k}: {v}\r\n" for k, v in auth("p-0-memory").items())

        async def answered(count: int) -> None:
            for _ in range(500):  # a bound, not a speed assertion
                if transport.written.count(b"HTTP/1.1 ") >= count:
                    return
                await asyncio.sleep(0.01)

        async def connection() -> None:
            protocol.connection_made(transport)
            assert len(guard) == 1 and protocol.address == "127.0.0.9"
            protocol.data_received(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            await answered(1)
            protocol.data_received(f"POST /api/v1/instances/p-0-memory/register HTTP/1.1\r\nHost: x\r\n{headers}"
                                   f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                                   .encode() + body)
            await answered(2)

        loop.run_until_complete(connection())
        assert _answers(bytes(transport.written)) == [(200, {"status": "ok"}), (200, {"status": "registered"})]
        assert protocol.is_authenticated and len(guard) == 0 and guard.held_by(auth("p-0-memory")["Authorization"]
                                                                               .split()[1]) == 1
        protocol.connection_lost(None)
        assert guard.connections == 0
    finally:
        loop.close()
        store.close()
