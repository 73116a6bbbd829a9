"""SSML, the subset voice agents use: what to say, where to pause, how fast.

``parse`` reads a whole document into a ``Script``: the text to speak, in runs, with the
pauses (``Break``), speaking rates (``Rate``) and sentence boundaries (``Boundary``)
between them. The utterance speaks a script as it speaks text (engine/utterance.py):
each run through the one segmenter, a break as exact silence.

Supported (docs/ssml.md is the reference for users):

- ``<speak>`` (optional: a document without it is read as its content);
- ``<break time="500ms">`` or ``strength="none|x-weak|weak|medium|strong|x-strong"``;
- ``<prosody rate="slow|150%|+20%|1.2">`` (nested rates multiply; pitch and volume are
  ignored, and said so);
- ``<phoneme alphabet="ipa" ph="...">word</phoneme>``: inline phonemes
  (engine/text/inline.py), timed as the written word;
- ``<sub alias="...">``: the alias is spoken (and timed) instead;
- ``<say-as interpret-as="characters|spell-out|cardinal|ordinal|telephone|date">``;
- ``<p>`` and ``<s>``: each ends a segment.

Any other element is spoken as its text content, and its name is given back in
``Script.ignored`` so the reply can say so once. The parser is defusedxml's: a document
with a DTD (the only way to declare entities, and so a billion laughs) is refused before
anything is expanded; only XML's five entities and character references are read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from xml.etree.ElementTree import Element, ParseError

import inflect
from defusedxml import DefusedXmlException
from defusedxml.ElementTree import fromstring

from voxwire.engine.text.lexicon import MAX_KEY_CHARS, MAX_VALUE_CHARS, LexiconError, entry

MAX_BREAK_SECONDS = 10.0
"""The longest pause a ``<break>`` may ask for (Google's bound too)."""

STRENGTHS = {"none": 0.0, "x-weak": 0.1, "weak": 0.25, "medium": 0.5, "strong": 0.75, "x-strong": 1.0}
"""A break's strength, in seconds."""

RATES = {"x-slow": 0.6, "slow": 0.8, "medium": 1.0, "fast": 1.25, "x-fast": 1.5, "default": 1.0}
"""A prosody rate's name, as a factor of the speaking rate."""

_TIME = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*(ms|s)\s*$")
_PERCENT = re.compile(r"^\s*([+-]?)(\d+(?:\.\d+)?)\s*%\s*$")
_NUMBER = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*$")
_DIGITS = re.compile(r"\d+")
_MONTHS = ("January February March April May June July August September October November December").split()
_INFLECT = inflect.engine()


class SsmlError(ValueError):
    """A document that cannot be spoken; the message says where (line and column) and why."""


@dataclass(frozen=True)
class Text:
    text: str
    """Plain text, with any inline phonemes (``[word](/phonemes/)``) the document asked for."""


@dataclass(frozen=True)
class Break:
    seconds: float


@dataclass(frozen=True)
class Rate:
    speed: float
    """The speed of the segments that follow, until the next ``Rate``: the utterance's
    own times the document's rate there, within the engines' range."""


@dataclass(frozen=True)
class Boundary:
    """The segment ends here (``</s>``, ``</p>``, a change of rate)."""


Item = Text | Break | Rate | Boundary


@dataclass
class Script:
    items: list[Item] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    """What was spoken as plain text or left out: unknown elements and attributes, in the
    order first met."""


def looks_like_ssml(text: str) -> bool:
    """Whether ``text`` is an SSML document: it starts with ``<speak`` (after any XML
    declaration). The OpenAI route reads such an input as SSML."""
    head = text.lstrip()
    if head.startswith("<?xml"):
        head = head[head.find("?>") + 2:].lstrip() if "?>" in head else head
    return head.startswith("<speak") and (len(head) == 6 or not head[6].isalnum())


def parse(document: str, speed: float = 1.0, speeds: tuple[float, float] = (0.5, 2.0)) -> Script:
    """The script of an SSML document, spoken at ``speed`` where it says no rate (a rate
    is kept within ``speeds``, as SSML lets a processor do). Raises ``SsmlError`` for
    one that is not well-formed XML (with its line and column), that has a DTD, or whose
    supported elements have values that cannot be read."""
    text = document.strip()
    # A document (its root, or a declaration or DTD before it), else a <speak>'s content.
    if not (looks_like_ssml(text) or text.startswith(("<?xml", "<!"))):
        text = f"<speak>{text}</speak>"
    try:
        root = fromstring(text, forbid_dtd=True, forbid_entities=True, forbid_external=True)
    except ParseError as e:
        line, column = e.position
        raise SsmlError(f"SSML is not well-formed at line {line}, column {column + 1}: {_reason(e)}") from None
    except DefusedXmlException:
        raise SsmlError("SSML may not have a DTD or declare entities: only XML's own (&amp; &lt; &gt; "
                        "&quot; &apos;) and character references are read") from None
    if _name(root) != "speak":
        raise SsmlError(f"an SSML document's root is <speak>, not <{_name(root)}>")
    script = Script()
    _Reader(script, speed, speeds).element(root, 1.0)
    return script


def _reason(e: ParseError) -> str:
    return str(e).split(":")[0]  # expat's reason, without its own position


def _name(element: Element) -> str:
    tag = element.tag
    return tag.rsplit("}", 1)[-1] if isinstance(tag, str) else str(tag)  # the SSML namespace, if any


class _Reader:
    def __init__(self, script: Script, speed: float, speeds: tuple[float, float]) -> None:
        self.script = script
        self.speed = speed
        self.speeds = speeds

    def rate(self, factor: float) -> list[Item]:
        low, high = self.speeds
        return [Boundary(), Rate(min(high, max(low, self.speed * factor)))]

    def say(self, text: str | None) -> None:
        if text:
            self.script.items.append(Text(text))

    def note(self, what: str) -> None:
        if what not in self.script.ignored:
            self.script.ignored.append(what)

    def element(self, e: Element, rate: float) -> None:
        name = _name(e)
        handler = getattr(self, f"_{name.replace('-', '_')}", None) if name in _ELEMENTS else None
        if handler is None:
            self.note(f"<{name}>")
            self.content(e, rate)
        else:
            handler(e, rate)
        self.say(e.tail)

    def content(self, e: Element, rate: float) -> None:
        self.say(e.text)
        for child in e:
            self.element(child, rate)

    def _speak(self, e: Element, rate: float) -> None:
        self.content(e, rate)

    def _s(self, e: Element, rate: float) -> None:
        self.script.items.append(Boundary())
        self.content(e, rate)
        self.script.items.append(Boundary())

    _p = _s

    def _break(self, e: Element, rate: float) -> None:
        time, strength = e.get("time"), e.get("strength")
        if time is not None:
            m = _TIME.match(time)
            if m is None:
                raise SsmlError(f"<break time={time!r}>: a time is a number of ms or s, as 500ms or 1.5s")
            seconds = float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)
        elif strength is not None:
            if strength not in STRENGTHS:
                raise SsmlError(f"<break strength={strength!r}>: one of {', '.join(STRENGTHS)}")
            seconds = STRENGTHS[strength]
        else:
            seconds = STRENGTHS["medium"]
        if seconds > MAX_BREAK_SECONDS:
            raise SsmlError(f"<break time={time!r}>: at most {MAX_BREAK_SECONDS:g} s")
        self.script.items.append(Break(seconds))
        self.content(e, rate)  # a break has no content; any is spoken rather than lost

    def _prosody(self, e: Element, rate: float) -> None:
        for attribute in ("pitch", "volume", "contour", "range", "duration"):
            if e.get(attribute) is not None:
                self.note(f"<prosody {attribute}>")
        asked = e.get("rate")
        inner = rate if asked is None else rate * _rate(asked)
        if inner != rate:
            self.script.items += self.rate(inner)
        self.content(e, inner)
        if inner != rate:
            self.script.items += self.rate(rate)

    def _phoneme(self, e: Element, rate: float) -> None:
        alphabet, ph = e.get("alphabet", "ipa"), e.get("ph")
        words = "".join(e.itertext()).strip()
        if alphabet.lower() != "ipa":
            raise SsmlError(f"<phoneme alphabet={alphabet!r}>: this server reads alphabet=\"ipa\", the voice's own "
                            "phonemes (GET /v1/voices lists them)")
        if not ph or not words:
            raise SsmlError("<phoneme> needs a ph attribute and the words it says")
        if any(ch in ph for ch in "/()[]\n") or len(ph) > MAX_VALUE_CHARS or len(words) > MAX_KEY_CHARS:
            raise SsmlError(f"<phoneme ph={ph[:40]!r}>: at most {MAX_VALUE_CHARS} phonemes, with no slash, bracket "
                            f"or parenthesis, for at most {MAX_KEY_CHARS} characters of words")
        try:
            entry(" ".join(words.split()), f"/{ph}/")
        except LexiconError as err:
            raise SsmlError(f"<phoneme ph={ph[:40]!r}>{words[:40]}: {err.why}") from None
        self.say(f"[{' '.join(words.split())}](/{ph}/)")

    def _sub(self, e: Element, rate: float) -> None:
        alias = e.get("alias")
        if alias is None:
            raise SsmlError("<sub> needs an alias attribute: the words to say")
        self.say(alias)

    def _say_as(self, e: Element, rate: float) -> None:
        kind = (e.get("interpret-as") or "").lower()
        text = "".join(e.itertext())
        said = _say_as(kind, text, e.get("format"))
        if said is None:
            self.note(f'<say-as interpret-as="{kind}">')
            said = text
        self.say(said)


_ELEMENTS = frozenset({"speak", "s", "p", "break", "prosody", "phoneme", "sub", "say-as"})


def _rate(value: str) -> float:
    if value in RATES:
        return RATES[value]
    if (m := _PERCENT.match(value)) is not None:
        sign, amount = m.group(1), float(m.group(2)) / 100
        factor = 1 + amount if sign == "+" else 1 - amount if sign == "-" else amount
    elif (m := _NUMBER.match(value)) is not None:
        factor = float(m.group(1))
    else:
        raise SsmlError(f"<prosody rate={value!r}>: a name ({', '.join(RATES)}), a percentage (150%, +20%) or a "
                        "factor (1.2)")
    if factor <= 0:
        raise SsmlError(f"<prosody rate={value!r}>: a rate above zero")
    return factor


def _say_as(kind: str, text: str, fmt: str | None) -> str | None:
    """What a ``<say-as>`` says, or None for a kind this server does not read (English)."""
    if kind in ("characters", "spell-out"):
        return " ".join(ch for ch in text if not ch.isspace())
    if kind == "cardinal":
        return text.replace(",", "").strip()
    if kind == "ordinal":
        digits = text.strip().replace(",", "")
        return _ordinal(digits) if digits.isdigit() else text
    if kind == "telephone":
        # Digit by digit, a pause at each group: "555-0100" is "5 5 5, 0 1 0 0".
        groups = _DIGITS.findall(text)
        return ", ".join(" ".join(group) for group in groups) if groups else text
    if kind == "date":
        return _date(text, (fmt or "").lower())
    return None


def _ordinal(digits: str) -> str:
    """"3" as "third": in words, since "3rd" is read as "3 r d" by some front ends."""
    words = _INFLECT.number_to_words(_INFLECT.ordinal(digits))
    return words if isinstance(words, str) else " ".join(words)


def _date(text: str, fmt: str) -> str:
    """A date's numbers, in the order ``format`` gives (``ymd``, ``mdy``, ``dmy``, ``md``,
    ``dm``, ``ym``, ``my``; ISO's ``ymd`` by default), said as "March fifth, 2024"."""
    numbers = [int(n) for n in _DIGITS.findall(text)]
    order = fmt if fmt and set(fmt) <= set("ymd") and len(fmt) == len(numbers) else "ymd"[: len(numbers)]
    if len(order) != len(numbers) or not numbers:
        return text
    parts = dict(zip(order, numbers))
    year, month, day = parts.get("y"), parts.get("m"), parts.get("d")
    if (month is not None and not 1 <= month <= 12) or (day is not None and not 1 <= day <= 31):
        return text
    said = []
    if month is not None:
        said.append(_MONTHS[month - 1])
    if day is not None:
        said.append(_ordinal(str(day)))
    out = " ".join(said)
    if year is not None:
        out = f"{out}, {year}" if out else str(year)
    return out
