"""One-off studies: experiments run once to settle a question, kept with their stored
results (results/) so that benchmarks/README.md's figures can be checked and re-run.
Not installed: pyproject.toml's package list leaves this folder out, so they run from a
checkout only (README.md here)."""
