"""Every table in benchmarks/README.md is generated from a stored JSON result."""

from __future__ import annotations

from voxwire.benchmarks import tables

OWNED = ("`voxwire bench`", "The torch Piper port", "Soak", "`--workers 1`", "Time to first audio at every rate")


def test_every_readme_table_is_generated_from_its_stored_result():
    text = tables.README.read_text()
    assert tables.BLOCK.search(text), "no generated tables at all"
    # The sections of the benchmarks that render their tables here. (Others' sections are
    # theirs to move onto markers; `python -m voxwire.benchmarks.tables --check` lists them all.)
    owned = [h for h in tables.sections(text) if h.startswith(OWNED)]
    assert len(owned) == len(OWNED), owned
    for heading in owned:
        loose = tables.loose_tables(tables.sections(text)[heading])
        assert loose == [], f"{heading}: tables typed in by hand; put them between table markers"
    fresh, changed = tables.regenerate(text)
    assert changed == [], f"stale tables, run python -m voxwire.benchmarks.tables: {changed}"
    assert fresh == text
    assert tables.console_tables(text) == []  # no table copied from a console any more


def test_a_changed_result_shows_as_a_stale_table(tmp_path):
    (tmp_path / "r.json").write_text(
        '{"args": {"rounds": 2}, "ttfa": {"native": {"median_ms": 100.0, "ratio_to_native": 1.0}}}'
    )
    text = "x\n<!-- table: rates r.json -->\n| old |\n<!-- /table -->\n"
    fresh, changed = tables.regenerate(text, tmp_path)
    assert changed == ["rates (r.json)"]
    assert "| native | 100.0 ms | 1.00 |" in fresh and "| old |" not in fresh
    assert tables.regenerate(fresh, tmp_path)[1] == []
