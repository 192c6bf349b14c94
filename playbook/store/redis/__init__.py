"""A store on a Redis server: the backend, its leases, its record format, what the server keeps,
and what went wrong talking to it, in words."""
