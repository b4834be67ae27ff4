"""Fault injection: the host survives killed workers, a dead fork server, failing adapters,
a full disk and guests that run out of memory, and loses nothing it acknowledged."""
