"""The one rule for names people give things: no control, format or line-breaking characters.

A name is shown in lists, logs, e-mail subjects and alert titles. A newline or tab breaks those
lines; U+202E (right-to-left override) or U+200B (zero-width space) make one name look like
another. So every name field (subscriptions, tokens, publisher tokens, units) takes :data:`Name`
or :data:`plain_text`, which refuse Unicode's control (Cc), format (Cf), surrogate (Cs) and
line/paragraph separator (Zl, Zp) characters, as ``unicodedata`` classifies them.
"""

from __future__ import annotations

import unicodedata
from typing import Annotated

from pydantic import AfterValidator, Field

REFUSED_CATEGORIES = {"Cc": "control", "Cf": "format", "Cs": "surrogate", "Zl": "line separator",
                      "Zp": "paragraph separator"}
MAX_NAME_LENGTH = 200


def plain_text(text: str) -> str:
    """``text``, or a ``ValueError`` naming the first refused character and where it is."""
    for position, char in enumerate(text, 1):
        category = unicodedata.category(char)
        if category in REFUSED_CATEGORIES:
            raise ValueError(f"must not contain control characters or Unicode format characters: U+{ord(char):04X} "
                             f"({REFUSED_CATEGORIES[category]}) at character {position}")
    return text


PlainText = AfterValidator(plain_text)
Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME_LENGTH), PlainText]
