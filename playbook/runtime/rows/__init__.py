"""Rows: the table of every row's state, the frames a run reads and returns, row memos, failures grouped."""
