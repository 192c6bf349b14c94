"""Scheduling: the scheduler and its workers, the held queue, one row's attempt and how it ends."""
