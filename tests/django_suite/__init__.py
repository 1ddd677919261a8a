"""Django's own ``tests/tasks/``, unmodified, run against RedisQueueBackend.

``python -m tests.django_suite`` (or ``nox -s django-suite-3.13``):

1. takes ``tests/tasks/`` from the source release of the Django installed
   (``django.get_version()``): ``pip download --no-binary :all: django==X.Y.Z`` once,
   kept with the extracted package in ``.nox/django-suite-cache/`` (``DJANGO_SUITE_CACHE``
   to move it). Those tests import nothing else from Django's ``tests/``. On Django 5.2
   there is no ``tests/tasks/`` and the ``django-tasks`` backport's sdist ships no tests:
   it says so and runs nothing (and stops if a later backport sdist does ship tests);
2. starts a private ``redis-server`` (``tests.support.servers.RedisServer``) and
   sets up Django with ``settings.py``: Django's own test settings, this app installed;
3. routes every ``TASKS`` alias that names Django's immediate or dummy backend to this
   app's, by a hook on Django's task backend handler (``backends.py``), so that the
   tests' ``@override_settings(TASKS=...)`` reach this backend while the test files stay
   as they are. For the immediate backend's tests, ``enqueue()`` pushes the job to Redis,
   runs the real ``Worker`` in burst mode until the queues are empty, and returns the
   job's result as read back from Redis; for the dummy's, jobs stay queued;
4. runs the package with Django's ``DiscoverRunner`` (``runner.py``), emptying Redis
   before each test, skipping exactly the tests in ``not_applicable.txt`` (each with
   its reason; a listed test that no longer exists stops the run), and prints passed,
   failed and not-applicable counts per module.
"""
