"""Plays (:mod:`.play`: what a play is, what it knows of tools, and which definition of each name
is current), their declared outputs (:mod:`.outputs`), and what a play's code reads
(:mod:`.reads`, :mod:`.stable`, :mod:`.bytecode`), as its fingerprint counts it."""
