"""The model-based tests' state machines and what they share (the tests themselves are
tests/test_protocol_model.py and tests/test_periodic_model.py).

- ``harness.py``: a client whose script calls fail on demand, the errors injected,
  deterministic job ids, the counters a run reports, and the run itself.
"""
