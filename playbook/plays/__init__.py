"""Plays (:mod:`.play`), their declared outputs (:mod:`.outputs`), and what each tool and play
name means in this process now (:mod:`.definitions`)."""
