"""An app with its own ``runworker`` command, as Django Channels has: listed before
django_redisqueue, it takes the name over (system check W002)."""
