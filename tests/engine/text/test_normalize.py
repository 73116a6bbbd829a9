from engine.text import normalize
from engine.text.normalize import normalize_piece


def test_whitespace_controls_and_typography():
    assert normalize("  It\u2019s\u00a0a  \u201ctest\u201d\u200b\x07\n\n") == "It's a \"test\""


def test_nfkc_folds_compatibility_forms():
    assert normalize("ｆｕｌｌ　ｗｉｄｔｈ！") == "full width!"


def test_pieces_join_like_the_whole():
    pieces = ["Hello  ", " wor", "ld.\u200b", "e", "\u0301"]
    assert normalize(normalize_piece("".join(pieces))) == normalize("".join(pieces))
