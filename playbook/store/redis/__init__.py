"""A store on a Redis server: the backend, its leases, its record format, what the server keeps."""
