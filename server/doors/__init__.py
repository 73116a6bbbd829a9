"""The doors: the ways clients come in, each a ``Door`` (server/doors/base.py) in its own
module, and none aware of another.

- ``ws``: protocol v1 over a WebSocket, ``/v1/stream`` (websocket/);
- ``http``: OpenAI's ``POST /v1/audio/speech`` (openai/, its voice names in voices.py);
- ``wyoming``: Home Assistant's Wyoming protocol over TCP, with ``--wyoming-port`` (wyoming/).

A new door is one class and one line here (or one argument to ``create_app``); the
service builds each with its ``Host``, mounts its routes, binds and starts it, and drains
its connections. Everything else (admission, the text budget, the idle timeout, an
utterance's life and the bounded send, accounting under the door's name) is the base's.
"""

from __future__ import annotations

from voxwire.server.doors.base import Door
from voxwire.server.doors.openai import OpenAIDoor
from voxwire.server.doors.websocket import WebSocketDoor
from voxwire.server.doors.wyoming import WyomingDoor

DOORS: tuple[type[Door], ...] = (WebSocketDoor, OpenAIDoor, WyomingDoor)
"""The doors a server opens, in the order their routes are mounted."""
