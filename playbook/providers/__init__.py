"""Providers: the frozen description of an upstream account (:mod:`.provider`), the governor
that acts on it (:mod:`.governor`, with what it keeps of one call in :mod:`.ticket`), and the
limiters under it (:mod:`.limits`), in this process or shared through Redis."""
