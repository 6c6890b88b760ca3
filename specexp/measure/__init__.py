"""Measurement rigour: repeats and warm-up around one engine, intervals for every figure, noise guards.

- :mod:`~specexp.measure.settings`: the ``measure`` config keys;
- :mod:`~specexp.measure.loop`: warm-up, then the repeats, on one backend server (machine state read around each);
- :mod:`~specexp.measure.summary`: the repeats -> result.json's ``repeats``, ``measure`` and ``metrics.intervals``;
- :mod:`~specexp.measure.intervals`: intervals over repeats, bootstrap over requests, ratio (speedup) intervals;
- :mod:`~specexp.measure.guards`: busy machine, disagreeing repeats, shared GPU;
- :mod:`~specexp.measure.machine`: load average, CPU count, GPU clocks and processes;
- :mod:`~specexp.measure.rounds`: the order a sweep measures its jobs' repeats in (interleaved rounds).
"""
