"""Prompts for a trace that gives only lengths and prefix-block hashes (mooncake), pure.

A mooncake line says a request had ``input_length`` prompt tokens whose blocks of
``block_tokens`` hash to ``hash_ids``: two requests sharing leading ids shared that prefix.
The text is made so the server sees exactly that: each hash id is one block of words drawn
from the id alone, so equal ids give byte-identical blocks and different ids different ones,
and a prompt is its blocks in order, the last one cut to the prompt's length.

Lengths are exact to the token where the tokenizer is additive over the words used: every word
is one the server's ``/tokenize`` counted as a single token with its leading space
(:func:`one_token_words` picks them), and a fixed ``overhead`` (a BOS token, a chat template)
is measured once. The sweep checks a sample against ``/tokenize`` and says so when it is not.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence

from tuner.load.dataset import TraceRequest

__all__ = ["CANDIDATE_WORDS", "TraceText", "one_token_words"]

# Common short English words: most BPE and SentencePiece vocabularies hold " word" as one
# token. The server decides which of them are (one_token_words).
CANDIDATE_WORDS: tuple[str, ...] = tuple("""
the of and to in is it you that he was for on are with as his they be at one have this from
or had by hot word but what some we can out other were all there when up use your how said an
each she which do their time if will way about many then them write would like so these her
long make thing see him two has look more day could go come did number sound no most people my
over know water than call first who may down side been now find any new work part take get
place made live where after back little only round man year came show every good me give our
under name very through just form sentence great think say help low line differ turn cause much
mean before move right boy old too same tell does set three want air well also play small end
put home read hand port large spell add even land here must big high such follow act why ask
men change went light kind off need house picture try us again animal point mother world near
build self earth father head stand own page should country found answer school grow study still
learn plant cover food sun four between state keep eye never last let thought city tree cross
farm hard start might story saw far sea draw left late run while press close night real life
few north open seem together next white children begin got walk example ease paper group always
music those both mark often letter until mile river car feet care second book carry took
science eat room friend began idea fish mountain stop once base hear horse cut sure watch color
face wood main enough plain girl usual young ready above ever red list though feel talk bird
soon body dog family direct pose leave song measure door product black short numeral class wind
question happen complete ship area half rock order fire south problem piece told knew pass since
top whole king space heard best hour better true during hundred five remember step early hold
west ground interest reach fast verb sing listen six table travel less morning ten simple several
vowel toward war lay against pattern slow center love person money serve appear road map rain
rule govern pull cold notice voice unit power town fine certain fly fall lead cry dark machine
note wait plan figure star box noun field rest correct able pound done beauty drive stood contain
front teach week final gave green quick develop ocean warm free minute strong special mind behind
clear tail produce fact street inch multiply nothing course stay wheel full force blue object
decide surface deep moon island foot system busy test record boat common gold possible plane
""".split())


def one_token_words(counts: Sequence[int | None], overhead: int) -> tuple[str, ...]:
    """The candidates the server counted as one token: ``counts[i]`` is ``/tokenize`` of
    ``" " + CANDIDATE_WORDS[i]`` (None: no answer), ``overhead`` that of the empty text."""

    return tuple(w for w, n in zip(CANDIDATE_WORDS, counts, strict=True)
                 if n is not None and n - overhead == 1)


class TraceText:
    """Prompt text for trace requests, from the one-token words the server confirmed."""

    # Fewer words than this make blocks of different ids too alike to tell apart reliably.
    MIN_WORDS = 16

    def __init__(self, words: Sequence[str], *, block_tokens: int, overhead: int, seed: int | str = 0) -> None:
        if len(words) < self.MIN_WORDS:
            raise ValueError(f"only {len(words)} one-token words (at least {self.MIN_WORDS} are needed)")
        self.words = tuple(words)
        self.block_tokens = block_tokens
        self.overhead = overhead
        self.seed = seed

    def reseeded(self, seed: int | str) -> TraceText:
        """The same words, lengths and overhead, with blocks drawn under another seed."""
        return TraceText(self.words, block_tokens=self.block_tokens, overhead=self.overhead, seed=seed)

    @functools.lru_cache(maxsize=4096)  # noqa: B019 - one TraceText per sweep; ids repeat across requests
    def block(self, hash_id: int) -> str:
        """The words of one block, a function of the id (and the study's seed) alone."""

        rng = random.Random(f"tuner-trace-block|{self.seed}|{hash_id}")
        return "".join(" " + rng.choice(self.words) for _ in range(self.block_tokens))

    def prompt(self, request: TraceRequest) -> str:
        """``request``'s prompt: its blocks in order, the last cut so that the prompt counts
        ``input_length`` tokens with the overhead (at least one word)."""

        want = max(1, request.input_length - self.overhead)
        full, rest = divmod(want, self.block_tokens)
        ids = request.hash_ids
        parts = [self.block(h) for h in ids[:full]]
        if rest:
            # A line whose ids cover fewer blocks than its length repeats its last id's words
            # (parse_dataset refuses such lines; the overhead can shift the cut by a block).
            tail_id = ids[full] if full < len(ids) else ids[-1]
            parts.append(_first_words(self.block(tail_id), rest))
        return "".join(parts)


def _first_words(block: str, n: int) -> str:
    # Words are " w" pieces: cut after the n-th.
    at = -1
    for _ in range(n):
        at = block.index(" ", at + 1)
    end = block.find(" ", at + 1)
    return block if end < 0 else block[:end]
