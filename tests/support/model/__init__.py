"""The model-based tests' state machines and what they share (the tests themselves are
tests/test_protocol_model.py and tests/test_periodic_model.py).

- ``harness.py``: a client whose script calls fail on demand, the errors injected,
  deterministic job ids, a snapshot of Redis, what every machine starts from, the
  counters a run reports, and the run itself.
- ``protocol/``: the model of the delivery protocol (``ProtocolMachine``), a module
  per area; ``periodic/``: the model of periodic jobs (``PeriodicMachine``), likewise.
  Each package's docstring says what its model covers and where each part is.
"""
