"""Imported by nothing: if a payload could make a worker import it, the tests see it."""

import os

import redis

redis.Redis.from_url(os.environ["REDISQUEUE_TEST_URL"]).set("test:canary", "imported")


def boom():
    raise AssertionError("tests.support.canary.boom ran")
