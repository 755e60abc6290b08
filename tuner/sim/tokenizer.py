"""The simulator's word-level tokenizer (deterministic; no files, no downloads).

Pieces are words, 1-3 digit numbers, single punctuation marks, newlines and other single
whitespace characters; a word, number or mark may carry one leading space, like a BPE
tokenizer's space marker. Joining the pieces gives back the text exactly.

Ids: a fixed canonical vocabulary (the generator's word list, numbers, punctuation, the
ChatML specials) gets collision-free ids by hashing with linear probing in a fixed order, so
they are the same in every process. Other pieces hash to an id without probing (collisions
are possible, as with any hashed vocabulary); decoding such an id returns the piece last seen
with it in this process, else a pronounceable pseudo-word, so /detokenize of arbitrary ids
(vLLM's random dataset does that) always yields text of the same token count.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence

VOCAB_SIZE = 49152
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ENDOFTEXT_ID, IM_START_ID, IM_END_ID = 0, 1, 2
EOS_ID = IM_END_ID   # SmolLM2-Instruct's generation EOS
_FIRST = len(SPECIALS)
_PIECE = re.compile(r"<\|endoftext\|>|<\|im_start\|>|<\|im_end\|>"
                    r"| ?[^\W\d_]+| ?\d{1,3}| ?[^\w\s]| ?_|\n|\s")
_CONS, _VOWELS = "bcdfghjklmnprstvz", "aeiou"


def _slot(piece: str) -> int:
    h = int.from_bytes(hashlib.blake2b(piece.encode("utf-8"), digest_size=8).digest(), "big")
    return _FIRST + h % (VOCAB_SIZE - _FIRST)


def pseudo_word(token_id: int) -> str:
    """A pronounceable stand-in for an id with no known piece (3 syllables, leading space)."""
    n = token_id
    out = []
    for _ in range(3):
        n, r = divmod(n, len(_CONS) * len(_VOWELS))
        out.append(_CONS[r // len(_VOWELS)] + _VOWELS[r % len(_VOWELS)])
    return " " + "".join(out)


class Tokenizer:
    def __init__(self, canonical: Iterable[str]) -> None:
        self._to_id: dict[str, int] = {p: i for i, p in enumerate(SPECIALS)}
        self._to_piece: dict[int, str] = dict(enumerate(SPECIALS))
        for piece in canonical:
            if piece in self._to_id:
                continue
            slot = _slot(piece)
            while slot in self._to_piece:
                slot = _FIRST + (slot - _FIRST + 1) % (VOCAB_SIZE - _FIRST)
            self._to_id[piece] = slot
            self._to_piece[slot] = piece
        self._seen: dict[int, str] = {}

    def pieces(self, text: str) -> list[str]:
        return _PIECE.findall(text)

    def piece_id(self, piece: str) -> int:
        known = self._to_id.get(piece)
        if known is not None:
            return known
        slot = _slot(piece)
        while slot in self._to_piece:   # never shadow a canonical piece (fixed set: stable)
            slot = _FIRST + (slot - _FIRST + 1) % (VOCAB_SIZE - _FIRST)
        if len(self._seen) > 500_000:   # bound memory in a long-lived server
            self._seen.clear()
        self._seen[slot] = piece
        return slot

    def encode(self, text: str) -> list[int]:
        return [self.piece_id(p) for p in self.pieces(text)]

    def piece(self, token_id: int) -> str:
        if token_id in self._to_piece:
            return self._to_piece[token_id]
        return self._seen.get(token_id) or pseudo_word(token_id)

    def is_special(self, token_id: int) -> bool:
        return 0 <= token_id < _FIRST

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(self.piece(i) for i in ids
                       if not (skip_special_tokens and self.is_special(i)))

    def canonical_id(self, piece: str) -> int | None:
        return self._to_id.get(piece)
