"""The run's state: built from its events, fanned out to views, read through one API; what it reads of providers."""
