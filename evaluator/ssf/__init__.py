"""Substream filters (SSF): ``{k | f(S_k[T, 0]) in (v1, v2)}`` over thousands of keys at once.

Every collective index here returns a *candidate* superset of the answer with a
stated guarantee, then verifies each candidate exactly, so what it reports equals
the brute-force answer. Windows are ``(now - T, now]`` on integer timestamps.
An index holds a key only while the key has an element in the retained horizon
(after ``expire``), so memory and housekeeping follow the keys with data, not every
key ever seen (:class:`~evaluator.ssf.base.KeyTable`).
"""
