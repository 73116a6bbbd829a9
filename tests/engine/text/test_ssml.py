"""engine/text/ssml.py: the SSML subset read into a script, and what is refused."""

from __future__ import annotations

import time

import pytest

from voxwire.engine.text.ssml import Boundary, Break, Rate, SsmlError, Text, looks_like_ssml, parse


def said(document: str, **kwargs) -> list[object]:
    """The script's items, with adjacent text joined."""
    out: list[object] = []
    for item in parse(document, **kwargs).items:
        if isinstance(item, Text) and out and isinstance(out[-1], Text):
            out[-1] = Text(out[-1].text + item.text)
        else:
            out.append(item)
    return out


def test_text_and_breaks_by_time_and_strength():
    assert said('<speak>Hello <break time="500ms"/>there<break time="1.5s"/>, you<break strength="weak"/>.</speak>') == [
        Text("Hello "), Break(0.5), Text("there"), Break(1.5), Text(", you"), Break(0.25), Text("."),
    ]
    assert said("<speak>a<break/>b</speak>") == [Text("a"), Break(0.5), Text("b")]  # medium


def test_a_document_without_speak_is_read_as_its_content():
    assert said('Fish &amp; chips <break time="200ms"/> now') == [Text("Fish & chips "), Break(0.2), Text(" now")]
    assert said("plain text") == [Text("plain text")]


def test_the_ssml_namespace_and_an_xml_declaration_are_read():
    doc = '<?xml version="1.0"?><speak version="1.1" xmlns="http://www.w3.org/2001/10/synthesis"><s>One</s></speak>'
    assert said(doc) == [Boundary(), Text("One"), Boundary()]


def test_prosody_rates_multiply_and_stay_within_the_engines_range():
    doc = '<speak>a<prosody rate="slow">b<prosody rate="50%">c</prosody>d</prosody><prosody rate="+300%">e</prosody></speak>'
    assert [i for i in said(doc, speed=1.0) if not isinstance(i, Boundary)] == [
        Text("a"), Rate(0.8), Text("b"), Rate(0.5), Text("c"), Rate(0.8), Text("d"), Rate(1.0), Rate(2.0), Text("e"),
        Rate(1.0),
    ]
    # At a request's speed 1.5, "fast" (1.25x) is 1.875.
    assert Rate(1.875) in said('<speak><prosody rate="fast">x</prosody></speak>', speed=1.5)


def test_phoneme_is_inline_phonemes_and_sub_says_its_alias():
    doc = '<speak><phoneme alphabet="ipa" ph="vˈɑks">Voxwire</phoneme> and <sub alias="World Wide Web">WWW</sub></speak>'
    assert said(doc) == [Text("[Voxwire](/vˈɑks/) and World Wide Web")]


@pytest.mark.parametrize("kind, text, fmt, says", [
    ("characters", "ABC", None, "A B C"),
    ("spell-out", "AI 2", None, "A I 2"),
    ("cardinal", "1,234", None, "1234"),
    ("ordinal", "3", None, "third"),
    ("telephone", "(555) 010-0199", None, "5 5 5, 0 1 0, 0 1 9 9"),
    ("date", "2024-03-05", None, "March fifth, 2024"),
    ("date", "3/5/2024", "mdy", "March fifth, 2024"),
    ("date", "5.3.", "dm", "March fifth"),
    ("date", "not a date", "mdy", "not a date"),
])
def test_say_as(kind, text, fmt, says):
    attribute = f' format="{fmt}"' if fmt else ""
    assert said(f'<speak><say-as interpret-as="{kind}"{attribute}>{text}</say-as></speak>') == [Text(says)]


def test_what_is_not_read_is_spoken_as_text_and_named_once():
    script = parse('<speak><emphasis>Hi</emphasis> <prosody pitch="high">there</prosody> <emphasis>again</emphasis> '
                   '<say-as interpret-as="currency">$5</say-as><audio src="x.wav">beep</audio></speak>')
    assert "".join(i.text for i in script.items if isinstance(i, Text)) == "Hi there again $5beep"
    assert script.ignored == ["<emphasis>", "<prosody pitch>", '<say-as interpret-as="currency">', "<audio>"]


@pytest.mark.parametrize("document, says", [
    ("<speak>a & b</speak>", "not well-formed at line 1, column 11"),
    ("<speak>\n  <s>one</p>\n</speak>", "not well-formed at line 2, column 11: mismatched tag"),
    ("<speak>open", "line 1, column 12: no element found"),
    ('<speak><break time="soon"/></speak>', "<break time='soon'>: a time is a number of ms or s"),
    ('<speak><break time="11s"/></speak>', "at most 10 s"),
    ('<speak><break strength="huge"/></speak>', "<break strength='huge'>: one of none, x-weak"),
    ('<speak><prosody rate="warp">x</prosody></speak>', "<prosody rate='warp'>: a name"),
    ('<speak><prosody rate="0%">x</prosody></speak>', "a rate above zero"),
    ('<speak><phoneme alphabet="x-sampa" ph="a">b</phoneme></speak>', "this server reads alphabet=\"ipa\""),
    ('<speak><phoneme ph="a/b">b</phoneme></speak>', "no slash, bracket or parenthesis"),
    ('<speak><phoneme ph="si">C++</phoneme></speak>', "a key is one or more words"),
    ("<speak><sub>WWW</sub></speak>", "<sub> needs an alias"),
    ("<?xml version='1.0'?><voice>x</voice>", "root is <speak>, not <voice>"),
])
def test_a_document_that_cannot_be_read_says_where_and_why(document, says):
    with pytest.raises(SsmlError) as e:
        parse(document)
    assert says in str(e.value), str(e.value)


def test_entities_and_dtds_are_refused_before_anything_is_expanded():
    # A billion laughs: ten levels of ten, 10**9 "lol"s if expanded.
    levels = "".join(f'<!ENTITY l{i} "{f"&l{i - 1};" * 10}">' for i in range(1, 10))
    bomb = f'<?xml version="1.0"?><!DOCTYPE speak [<!ENTITY l0 "lol">{levels}]><speak>&l9;</speak>'
    external = '<!DOCTYPE speak [<!ENTITY x SYSTEM "file:///etc/passwd">]><speak>&x;</speak>'
    for document in (bomb, external, '<!DOCTYPE speak><speak>hi</speak>'):
        start = time.process_time()
        with pytest.raises(SsmlError, match="may not have a DTD or declare entities"):
            parse(document)
        assert time.process_time() - start < 1.0  # refused, not expanded (expanding takes minutes)
    with pytest.raises(SsmlError, match="not well-formed"):
        parse("<speak>&undeclared;</speak>")


def test_an_input_is_ssml_when_it_starts_with_speak():
    assert looks_like_ssml(" <speak>hi</speak>") and looks_like_ssml('<?xml version="1.0"?>\n<speak/>')
    assert not looks_like_ssml("<speaker> said hi") and not looks_like_ssml("say <speak>")
