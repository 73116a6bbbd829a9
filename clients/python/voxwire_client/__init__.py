"""Python client for Voxwire (protocol v1): asyncio first, with a small sync helper."""

from voxwire_client.client import Audio, Client, Closed, Event, ServerError, Utterance
from voxwire_client.sync import Result, synthesize

__all__ = ["Audio", "Client", "Closed", "Event", "Result", "ServerError", "Utterance", "synthesize"]
