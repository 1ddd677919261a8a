#!/usr/bin/env python
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
    from mysite.tracing import set_up_tracing

    set_up_tracing()  # when OpenTelemetry's SDK is installed (make demo installs it)
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
