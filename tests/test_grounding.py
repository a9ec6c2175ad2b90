from __future__ import annotations

from ncpbench.auditors.grounding import is_grounded as grounded


def test_quotes_are_found_despite_whitespace_and_curly_quotes() -> None:
    assert grounded("“the key   melts”", 'And then "the key melts" in her pocket.')


def test_short_quotes_are_not_evidence() -> None:
    assert not grounded("no", "Nobody knows the way.")


def test_quotes_must_match_whole_words() -> None:
    assert not grounded("key melt", "the key melts away")
    assert grounded("key melts", "the key melts away")
