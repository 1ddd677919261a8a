from django.apps import AppConfig


class SupportConfig(AppConfig):
    """The tests' app: its ``tasks`` module, which the workers the tests start discover
    as any app's; its models; its ``outbox_produce`` command. Labelled "tests", as when
    the app was the ``tests`` package itself: its tables stay ``tests_<model>``."""

    name = "tests.support"
    label = "tests"
