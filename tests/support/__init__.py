"""What the tests share and are not tests themselves: the task modules the suites
enqueue, the private Redis servers and topologies, the key names, the fuzzing values,
the docs' samples, and the like."""
