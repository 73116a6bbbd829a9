"""CosyVoice2's text front end, as the pinned official commit's ``text_normalize`` does it
(FunAudioLLM/CosyVoice ace7c47, cosyvoice/cli/frontend.py and utils/frontend_utils.py).

* Normalisation: wetext 0.0.7 (WeTextProcessing's FSTs shipped in its wheel, so nothing
  is downloaded; the official pin 0.0.4 is the same code fetching them from ModelScope),
  then for Chinese the official clean-ups, for everything else inflect's number words
  for the digits wetext leaves.
* Splitting: ``split_paragraph`` (80 max, 60 min, merge a tail under 20). Lengths are
  characters for Chinese text and tokens otherwise, as in the official code.

Adapted to text that streams in: the server hands the engine one segment at a time
(engine/text/segment.py), so each segment is normalised and split on its own; a segment
never waits for later text. ``final=False`` leaves a segment that is not the end of the
utterance without the full stop the official splitter appends to the last piece.
"""

from __future__ import annotations

import functools
import re
import threading
import unicodedata
from collections.abc import Callable

_CJK = re.compile(r"[\u4e00-\u9fff]+")
_ZH_STOPS = ("。", "？", "！", "；", "：", "、", ".", "?", "!", ";")
_EN_STOPS = (".", "?", "!", ";", ":")
MAX_TOKENS, MIN_TOKENS, MERGE_TOKENS = 80, 60, 20
_lock = threading.Lock()


@functools.lru_cache(maxsize=1)
def _normalizers() -> tuple[object, object, object]:
    # Loaded once, lazily (the Frontend calls load_normalizers at engine load): wetext
    # reads its FSTs, inflect's import is slow; neither is needed before CosyVoice2 runs.
    import inflect
    from wetext import Normalizer

    # The pinned commit's arguments: ZhNormalizer(remove_erhua=False), EnNormalizer().
    return Normalizer(remove_erhua=False), Normalizer(), inflect.engine()


def load_normalizers() -> None:
    """Load wetext's FSTs and inflect now (seconds on a busy CPU), not on first use."""
    _normalizers()


def contains_chinese(text: str) -> bool:
    return bool(_CJK.search(text))


def spell_out_number(text: str, inflect_parser: object) -> str:
    """Every run of digits (``str.isdigit``, as the official loop) as inflect's words."""
    out: list[str] = []
    start: int | None = None
    for i, c in enumerate(text):
        if c.isdigit():
            start = i if start is None else start
            continue
        if start is not None:
            out.append(inflect_parser.number_to_words(text[start:i]))  # type: ignore[attr-defined]
            start = None
        out.append(c)
    if start is not None:
        out.append(inflect_parser.number_to_words(text[start:]))  # type: ignore[attr-defined]
    return "".join(out)


def replace_blank(text: str) -> str:
    """Drop spaces except between two non-space ASCII characters (as the official code)."""
    out = []
    for i, c in enumerate(text):
        if c != " ":
            out.append(c)
        elif i + 1 < len(text) and text[i + 1].isascii() and text[i + 1] != " " and text[i - 1].isascii() and text[i - 1] != " ":
            out.append(c)
    return "".join(out)


def _zh_cleanup(text: str) -> str:
    text = text.replace("\n", "")
    text = replace_blank(text)
    text = text.replace("²", "平方").replace("³", "立方")
    text = text.replace(".", "。").replace(" - ", "，")
    text = text.replace("（", "").replace("）", "").replace("【", "").replace("】", "").replace("`", "")
    text = text.replace("——", " ")
    return re.sub(r"[，,、]+$", "。", text)


def normalize_text(text: str) -> str:
    """The official ``text_normalize(text, split=False)``. Text with ``<|...|>`` markup is
    passed through untouched, as the official code skips its front end for it."""
    if "<|" in text and "|>" in text:
        return text
    text = text.strip()
    if not text:
        return text
    zh, en, parser = _normalizers()
    with _lock:  # wetext's and inflect's caches are not documented as thread-safe
        if contains_chinese(text):
            return _zh_cleanup(zh.normalize(text))  # type: ignore[attr-defined]
        return spell_out_number(en.normalize(text), parser)  # type: ignore[attr-defined]


def is_only_punctuation(text: str) -> bool:
    """Empty, or only Unicode punctuation and symbols (the official ``[\\p{P}\\p{S}]*``)."""
    return all(unicodedata.category(c)[0] in "PS" for c in text)


def split_paragraph(
    text: str,
    encode: Callable[[str], list[int]],
    lang: str,
    max_len: int = MAX_TOKENS,
    min_len: int = MIN_TOKENS,
    merge_len: int = MERGE_TOKENS,
    final: bool = True,
) -> list[str]:
    """The official splitter: cut after sentence punctuation, then greedily join sentences
    while the piece stays within ``max_len`` (or is still under ``min_len``); a tail
    under ``merge_len`` joins the piece before it. ``lang`` "zh" counts characters,
    anything else tokens."""

    def length(s: str) -> int:
        return len(s) if lang == "zh" else len(encode(s))

    stops = _ZH_STOPS if lang == "zh" else _EN_STOPS
    if not text:
        return []
    if final and text[-1] not in stops:
        text += "。" if lang == "zh" else "."
    sentences: list[str] = []
    start = 0
    for i, c in enumerate(text):
        if c not in stops:
            continue
        if i > start:
            sentences.append(text[start:i] + c)
        if i + 1 < len(text) and text[i + 1] in ('"', "”") and sentences:
            sentences[-1] += text[i + 1]
            start = i + 2
        else:
            start = i + 1
    if start < len(text) and not final:  # a streamed segment's unterminated tail is kept
        sentences.append(text[start:])
    pieces: list[str] = []
    current = ""
    for sentence in sentences:
        if length(current + sentence) > max_len and length(current) > min_len:
            pieces.append(current)
            current = ""
        current += sentence
    if current:
        if length(current) < merge_len and pieces:
            pieces[-1] += current
        else:
            pieces.append(current)
    return pieces


def split_text(text: str, encode: Callable[[str], list[int]], final: bool = True) -> list[str]:
    """Normalised text -> the pieces the LM speaks one at a time (official
    ``text_normalize(split=True)`` after normalisation), only-punctuation pieces dropped."""
    if "<|" in text and "|>" in text:
        return [text]
    lang = "zh" if contains_chinese(text) else "en"
    return [p for p in split_paragraph(text, encode, lang, final=final) if not is_only_punctuation(p)]


def text_pieces(text: str, encode: Callable[[str], list[int]], final: bool = True) -> list[list[int]]:
    """Raw text -> token ids per piece: normalise, split, encode (what synthesis needs)."""
    return [ids for ids in (encode(p) for p in split_text(normalize_text(text), encode, final)) if ids]


def split_ids(ids: list[int], boundaries: set[int], max_tokens: int = 80, min_tokens: int = 20) -> list[list[int]]:
    """A guard on token ids alone (no text): split a long sequence at punctuation tokens
    (``boundaries``) into pieces of at most ``max_tokens``; a piece shorter than
    ``min_tokens`` is not split off. ``text_pieces`` is the official splitting."""
    pieces: list[list[int]] = []
    start = 0
    while len(ids) - start > max_tokens:
        end = start + max_tokens
        cut = next((i + 1 for i in range(end - 1, start + min_tokens - 1, -1) if ids[i] in boundaries), end)
        pieces.append(ids[start:cut])
        start = cut
    if start < len(ids):
        pieces.append(ids[start:])
    return pieces
