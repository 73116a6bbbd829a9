"""The ``voxwire`` command, the one module that sits above every part of the project.

``voxwire serve`` runs the server (``server.cli``), ``voxwire say`` is the Python client's
command (``voxwire_client.cli``; its own distribution installs it alone as
``voxwire-say``), ``voxwire bench`` runs the benchmarks (``benchmarks.bench``). Nothing
below imports this package: the server depends on neither its client nor its benchmarks.
"""
