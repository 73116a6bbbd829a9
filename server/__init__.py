"""The Voxwire server: protocol v1 over WebSocket, in front of an engine worker."""
