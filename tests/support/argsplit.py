"""HTCondor's new (V2 raw) argument syntax, split by a small splitter written independently of
jobstore.submit: what the submit tests compare the package's arguments with."""

from __future__ import annotations


def split_v2(raw: str) -> list[str]:
    """The words of a V2 `arguments` value: spaces or tabs separate, '...' quotes, '' is a
    quote inside quotes."""
    words: list[str] = []
    word: list[str] = []
    in_word = quoted = False
    i = 0
    while i < len(raw):
        c = raw[i]
        if quoted:
            if raw.startswith("''", i):
                word.append("'")
                i += 1
            elif c == "'":
                quoted = False
            else:
                word.append(c)
        elif c in " \t":
            if in_word:
                words.append("".join(word))
            word, in_word = [], False
        else:
            in_word = True
            if c == "'":
                quoted = True
            else:
                word.append(c)
        i += 1
    assert not quoted, f"unterminated quote in {raw!r}"
    if in_word:
        words.append("".join(word))
    return words
