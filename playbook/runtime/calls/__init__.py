"""Calls: what ``ctx`` does for a row (the call pipeline, batching, batch jobs, sub-plays) what it may use of the run, and the level of rows in flight their waits set."""
