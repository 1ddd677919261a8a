"""A task module that cannot load: a schedule naming a task here must be reported, not
stop every command (tests/test_periodic.py)."""

raise RuntimeError("this module raises as it loads")
