"""Written words in scripts with spaces and without (engine/text/words.py): what word
timings name, and how the words heard at a cancel are written back."""

from __future__ import annotations

import pytest

from voxwire.engine.text.words import join, pieces, unspaced


@pytest.mark.parametrize("token, expected", [
    ("museum,", ["museum,"]),
    ("你好，世界。", ["你", "好", "，", "世", "界", "。"]),
    ("iPhoneを買った", ["iPhone", "を", "買", "っ", "た"]),
    ("コーヒー", ["コ", "ー", "ヒ", "ー"]),  # the long-vowel mark goes with the kana
    ("価格は2024円", ["価", "格", "は", "2024", "円"]),
    ("ที่นี่", ["ที่", "นี่"]),  # a Thai consonant with its vowel and tone marks
    ("שלום", ["שלום"]),  # Hebrew is written with spaces
    ("서울에", ["서울에"]),  # so is Korean
])
def test_a_token_is_cut_where_a_script_written_without_spaces_is(token, expected):
    assert pieces(token) == expected


def test_words_are_joined_with_spaces_only_between_scripts_written_with_them():
    assert join(["the", "quick", "fox"]) == "the quick fox"
    assert join(["今", "日", "は"]) == "今日は"
    assert join(["I", "said", "你", "好", "to", "her"]) == "I said 你好 to her"
    assert join(["iPhone", "を", "買", "っ", "た"]) == "iPhone を買った"  # a space it may not have had
    assert join([]) == ""
    assert unspaced("你") and not unspaced("you") and not unspaced("2024")
