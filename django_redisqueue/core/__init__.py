"""The task API and what a job is, with no Redis in it: tasks and their results, the
fan-out handles, the job envelope, the settings and the task registry."""
