"""Estimates: a pilot on a sample of the rows, projected over the frame."""
