"""Piper VITS voices: the embedded default engine."""
