"""Whatever the suites use that is not a test: the tests' Django app (labelled "tests":
its settings, URLs, models, command and the task modules the suites enqueue) and the
helpers (private servers and topologies, keys, fuzzing values, the pages' code blocks,
the model-based tests' state machines...). docs/development.md, "The layout of the
tests", lists them."""
