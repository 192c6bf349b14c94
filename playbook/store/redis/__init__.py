"""A store on a Redis server: the backend, its leases, its record format, what the server keeps.

``backend`` is the store's backend (:class:`RedisBackend`) and the keys it writes under,
``leases`` its leases as Lua scripts, ``format`` how a record and a row memo look in Redis,
``durability`` what the server keeps of what it is given, ``failures`` what went wrong in words
a user can act on.  It imports the store's protocol and records (``store.protocol``,
``store.records``), never the rest of the store; ``store.location`` reads ``durability``'s names
and opens ``backend`` when a store names a ``redis://`` URL, so the Redis client is imported
only then.
"""
