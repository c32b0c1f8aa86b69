"""How the kit writes performs in its messages, and how it compares arguments.

* A perform is written as a call: ``shop.fetch('https://a.test/', 2)``.
* Arguments are compared with ``==``, the expected value on the left, so a
  matcher (:data:`unittest.mock.ANY`, ``pytest.approx(...)``, any object with
  an ``__eq__``) given as an expected argument decides; arrays (anything with
  a ``shape`` and a ``dtype``) compare by shape and elements.
* A mismatch between two lists of performs is shown as the first differing
  position and a diff aligned on the performs the two lists share.
"""
from __future__ import annotations

import re

__tracebackhide__ = True

_LONGEST_ARGUMENT = 120


def short_repr(value) -> str:
    """``repr(value)`` on one line, cut to a readable length."""
    text = re.sub(r"\s*\n\s*", " ", repr(value))
    return text if len(text) <= _LONGEST_ARGUMENT else text[:_LONGEST_ARGUMENT - 3] + "..."


def call(effect, args) -> str:
    """``name(arg, ...)``: a perform written as the call it is."""
    return f"{effect.name}({', '.join(map(short_repr, args))})"


def times(n: int) -> str:
    """'once', 'twice', '3 times'."""
    return {0: "0 times", 1: "once", 2: "twice"}.get(n, f"{n} times")


def ordinal(n: int) -> str:
    """'1st', '2nd', '3rd', '11th', '22nd'."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def equal(expected, actual) -> bool:
    """``expected == actual`` as a test means it (see the module docstring)."""
    if expected is actual:
        return True
    if _is_array(expected) or _is_array(actual):
        import numpy
        try:
            return bool(numpy.array_equal(expected, actual))
        except (TypeError, ValueError):
            return False
    try:
        return bool(expected == actual)
    except (TypeError, ValueError):   # an __eq__ whose result has no truth value
        return False


def _is_array(value) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype")


def args_match(expected: tuple, actual: tuple) -> bool:
    return len(expected) == len(actual) and all(map(equal, expected, actual))


def first_difference(expected: tuple, actual: tuple) -> str:
    """Where two argument tuples first differ, in words."""
    if len(expected) != len(actual):
        return f"{plural(len(actual), 'argument')}, expected {len(expected)}"
    for i, (e, a) in enumerate(zip(expected, actual), 1):
        if not equal(e, a):
            return f"argument {i} is {short_repr(a)}, expected {short_repr(e)}"
    return "the same arguments"


def diff(expected: list, actual: list, same, show) -> list[str]:
    """Lines of a diff of two lists (``-`` expected only, ``+`` actual only,
    blank: both), aligned on a longest common subsequence under ``same(e, a)``
    (not on text: a matcher equals what it matches)."""
    n, m = len(expected), len(actual)
    # longest[i][j]: longest common subsequence of expected[i:] and actual[j:]
    longest = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            longest[i][j] = (longest[i + 1][j + 1] + 1 if same(expected[i], actual[j])
                             else max(longest[i + 1][j], longest[i][j + 1]))
    lines, i, j = [], 0, 0
    while i < n or j < m:
        if i < n and j < m and same(expected[i], actual[j]):
            lines.append(f"    {show(actual[j])}")
            i, j = i + 1, j + 1
        elif i < n and (j == m or longest[i + 1][j] >= longest[i][j + 1]):
            lines.append(f"  - {show(expected[i])}")
            i += 1
        else:
            lines.append(f"  + {show(actual[j])}")
            j += 1
    return lines
