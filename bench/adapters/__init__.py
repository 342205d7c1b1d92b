"""One module per system under test: its schema, enqueue side and worker side."""
