"""The Qwen2 byte-level BPE from ``CosyVoice-BlankEN/``, plus CosyVoice2's special tokens.

Built with the Hugging Face ``tokenizers`` library (a dependency of this engine).
The release ships ``vocab.json`` + ``merges.txt`` (and maybe ``tokenizer.json``);
we assemble Qwen2's pipeline from them: NFC, Qwen2's split regex, byte-level.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

# Qwen2's pre-tokenisation pattern (contractions, letters, single digits, punctuation runs, spaces).
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Added by CosyVoice2 on top of Qwen2's own (order fixes their ids).
COSYVOICE2_SPECIALS = (
    "<|im_start|>", "<|im_end|>", "<|endofprompt|>",
    "[breath]", "<strong>", "</strong>", "[noise]",
    "[laughter]", "[cough]", "[clucking]", "[accent]",
    "[quick_breath]",
    "<laughter>", "</laughter>",
    "[hissing]", "[sigh]", "[vocalized-noise]",
    "[lipsmack]", "[mn]",
)  # fmt: skip


class TextTokenizer:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tok = tokenizer

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size(with_added_tokens=True)


def _from_vocab_merges(directory: Path) -> Tokenizer:
    vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
    merges = []
    for line in (directory / "merges.txt").read_text(encoding="utf-8").splitlines():
        if line.startswith("#version") or not line.strip():
            continue
        a, b = line.split(" ")
        merges.append((a, b))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def load_tokenizer(directory: Path) -> TextTokenizer:
    directory = Path(directory)
    if (directory / "tokenizer.json").is_file():
        tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
    else:
        tok = _from_vocab_merges(directory)
    # Qwen2's own added tokens (<|endoftext|>, <|im_start|>, ...), in id order.
    config_path = directory / "tokenizer_config.json"
    if config_path.is_file():
        config = json.loads(config_path.read_text(encoding="utf-8"))
        added = config.get("added_tokens_decoder", {})
        for _, spec in sorted(added.items(), key=lambda kv: int(kv[0])):
            tok.add_special_tokens(
                [AddedToken(spec["content"], special=True, normalized=False, lstrip=False, rstrip=False)]
            )
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in COSYVOICE2_SPECIALS])
    return TextTokenizer(tok)
