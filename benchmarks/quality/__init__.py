"""The quality harness: what a listener hears, measured beside when it hears it.

- ``rows``: what speaks (the reference, Voxwire's engine, doors and formats, the peers);
- ``seams``: the spectral flux where a stream's pieces join, against the rest of it;
- ``asr`` and ``normalise``: Whisper's transcript, and the word error rate against the text;
- ``dnsmos``: DNSMOS P.835 (SIG, BAK, OVRL), a proxy for artefacts and noise;
- ``score``: one row's figures; ``targets``: what they must show.

``python -m voxwire.benchmarks.quality`` runs it all (``__main__``); ``paired`` hears every
format on one audio, ``precision`` the engine in bf16 against fp32; ``voxwire bench`` reports
WER and DNSMOS for every server it measures.
"""
