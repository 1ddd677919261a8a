"""Redis: the client of a backend's keys and its error policy, the key schema, the Lua
scripts, the protocol's writes (``broker``) and the read-side queries (``queries``)."""
