"""The text front end against the reference's own ``text_normalize`` and ``split_paragraph``.

The reference frontend object is built without its ONNX sessions: ``text_normalize``
needs only the normalisers (wetext with the pinned commit's arguments, inflect) and a
tokenizer, for which ours stands in (its ids equal Hugging Face's, test_parity.py).
The oracle's frontend_utils.py is byte-identical to the pinned commit's (README.md).
"""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest

from voxwire.engine.cosyvoice2.text import (
    contains_chinese,
    normalize_text,
    spell_out_number,
    split_paragraph,
    split_text,
    text_pieces,
)
from voxwire.engine.cosyvoice2.tokenizer import load_tokenizer

from . import oracle_frontend

ENGLISH = [
    "It costs $12.50, or 1,234.5 dollars and 7% more.",
    "On March 5, 2024 at 3:30 pm, 45 people met in room 101.",
    "Dr. Smith paid £3.2 million in 1999; then he left",
    "Call 555-0123 before 10am.",
    "The 2nd and 3rd runners finished in 2.5 hours!",
]
CHINESE = [
    "今天是2024年3月5日，气温-3.5°C，价格¥128.50元，增长了15%。",
    "我有3个苹果和2.5kg香蕉，电话是13812345678",
    "我用iPhone 15拍了20张照片（很好看），面积是30m²。",
    "会议在2023-10-01 14:30举行 - 请准时参加、",
    "他说：“我们明天见。”然后走了.",
]
MIXED = ["Hello 世界, this is 2024年.", "GPT-4 的价格是$20每月"]


@pytest.fixture(scope="module")
def encode(tiny_dir: Path):
    return load_tokenizer(tiny_dir / "CosyVoice-BlankEN").encode


@pytest.fixture(scope="module")
def official(reference, encode) -> types.SimpleNamespace:
    import inflect
    from wetext import Normalizer

    cls = oracle_frontend.frontend_class()
    fe = cls.__new__(cls)
    fe.use_ttsfrd = False  # the oracle's (2025-06) switch; the pinned one reads text_frontend
    fe.text_frontend = "wetext"
    fe.zh_tn_model = Normalizer(remove_erhua=False)  # the pinned commit's arguments
    fe.en_tn_model = Normalizer()
    fe.inflect_parser = inflect.engine()
    fe.tokenizer = types.SimpleNamespace(encode=lambda text, allowed_special=None: encode(text))
    fe.allowed_special = "all"
    return types.SimpleNamespace(
        normalize=lambda text: cls.text_normalize(fe, text, split=False),
        split=lambda text: cls.text_normalize(fe, text, split=True),
        utils=oracle_frontend.frontend_utils(),
        inflect=fe.inflect_parser,
    )


@pytest.mark.parametrize("text", ENGLISH + CHINESE + MIXED)
def test_normalisation_equals_reference(official, text: str) -> None:
    ours = normalize_text(text)
    assert ours == official.normalize(text)
    if not contains_chinese(text):
        assert not any(c.isdigit() for c in ours), ours  # every number is spoken
    # Negative control: inflect alone (no wetext) reads currency, dates and decimals
    # differently, so the comparison above does tell the two apart.
    if any(c in text for c in "$£¥%:.") and any(c.isdigit() for c in text):
        assert spell_out_number(text.strip(), official.inflect) != official.normalize(text)


def test_numbers_dates_currency_are_spoken(official) -> None:
    # What the official front end says, pinned here so a wetext/inflect change shows up.
    # (wetext 0.0.7, like the official 0.0.4, leaves a space before punctuation it touched.)
    assert normalize_text("It costs $12.50.") == "It costs twelve point five dollars ."
    assert normalize_text("I have 3 cats") == "I have three cats"
    assert normalize_text("价格¥128.50元，增长了15%") == official.normalize("价格¥128.50元，增长了15%")
    assert "百分之十五" in normalize_text("增长了15%")
    assert normalize_text("2024年3月5日") == "二零二四年三月五日"
    # Markup is left alone, as the official code skips its front end for it.
    assert normalize_text("<|endofprompt|>Say 12 words") == "<|endofprompt|>Say 12 words"
    assert normalize_text("   ") == ""


@pytest.mark.parametrize("text", ENGLISH + CHINESE + MIXED)
def test_splitting_equals_reference(official, encode, text: str) -> None:
    assert split_text(normalize_text(text), encode) == official.split(text)


def _long(sentences: list[str], n: int) -> str:
    return "".join(sentences[i % len(sentences)] for i in range(n))


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_split_paragraph_equals_reference_on_long_text(official, encode, lang: str) -> None:
    """Many sentences: the 80/60/20 rules (tokens in English, characters in Chinese)."""
    if lang == "en":
        text = _long(["The cat sat on the mat. ", "A rather longer sentence follows here, with a comma! ", "Why? ", "Short; "], 23)
    else:
        text = _long(["今天天气很好。", "我们一起去公园散步吧，好不好？", "好！", "这是一个比较长的句子，用来测试分段的逻辑；"], 31)
    ref = official.utils.split_paragraph(text, encode, lang, token_max_n=80, token_min_n=60, merge_len=20, comma_split=False)
    ours = split_paragraph(text, encode, lang)
    assert len(ref) >= 3, ref  # really split
    assert ours == ref
    # Negative control: other limits (50 max, 30 min) split this text differently.
    assert split_paragraph(text, encode, lang, max_len=50, min_len=30) != ref


def test_streamed_segment_keeps_its_open_end(encode) -> None:
    """A segment that is not the end of the utterance gets no full stop appended, and
    its pieces join back to it."""
    segment = "The first clause runs on, and on, without an end"
    assert split_text(segment, encode, final=False) == [segment]
    assert split_text(segment, encode) == [segment + "."]  # the official last piece
    text = _long(["One sentence here. ", "And another one! "], 20) + "an open tail"
    pieces = split_text(text, encode, final=False)
    assert "".join(pieces) == text and len(pieces) > 1


def test_text_pieces_encode_each_piece(encode) -> None:
    pieces = text_pieces("I have 3 cats. " * 30, encode)
    assert len(pieces) > 1 and all(pieces)
    assert pieces[0] == encode(split_text(normalize_text("I have 3 cats. " * 30), encode)[0])
    assert text_pieces("!?", encode) == []  # only punctuation: nothing to speak


@pytest.mark.slow  # a fresh process loads the text front end
def test_normalisation_needs_no_network(tmp_path: Path) -> None:
    """wetext ships its FSTs in the wheel: with every socket refused, a fresh process
    still normalises Chinese and English."""
    script = (
        "import socket\n"
        "def refuse(*a, **k):\n"
        "    raise RuntimeError('network access')\n"
        "socket.socket.connect = refuse\n"
        "socket.create_connection = refuse\n"
        "socket.getaddrinfo = refuse\n"
        "from voxwire.engine.cosyvoice2.text import normalize_text\n"
        "print(normalize_text('价格是12.5元'))\n"
        "print(normalize_text('It is 12 dollars'))\n"
    )
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=170,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["价格是十二点五元", "It is twelve dollars"]
