from __future__ import annotations

# The check is a rule of the grounded protocol, so it lives in the core (ncpbench.protocol).
from ncpbench.protocol import is_grounded as grounded


def test_quotes_are_found_despite_whitespace_and_curly_quotes() -> None:
    assert grounded("“the key   melts”", 'And then "the key melts" in her pocket.')


def test_short_quotes_are_not_evidence() -> None:
    assert not grounded("no", "Nobody knows the way.")


def test_quotes_must_match_whole_words() -> None:
    assert not grounded("key melt", "the key melts away")
    assert grounded("key melts", "the key melts away")


def test_outer_quote_marks_and_ellipses_are_trimmed() -> None:
    assert grounded("…the key melts…", "And then the key melts in her pocket.")
    assert not grounded("", "anything at all") and not grounded(None, "anything at all")
