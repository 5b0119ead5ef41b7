"""Response (and request) models of the API: the public JSON shapes, separate from the analytics
types, one module per concern: :mod:`~.common` (version, path parameters, errors),
:mod:`~.jobs`, :mod:`~.diagnosis`, :mod:`~.system`, :mod:`~.control`, :mod:`~.tokens`.

Units: bytes in bytes, times ISO 8601 UTC, durations in seconds, rates in MiB/s (2**20 B/s).
"""
