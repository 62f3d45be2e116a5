"""The names every layer agrees on for streams, with no imports (the evaluator's pure code reads them too)."""

#: The stream every deployment has: the market events, on ``settings.events_topic``.
TRADES = "trades"
