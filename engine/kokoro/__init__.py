"""Kokoro-82M: StyleTTS2 with an iSTFTNet decoder, 24 kHz, in plain torch (engine/kokoro/model.py)."""
