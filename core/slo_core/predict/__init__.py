"""Request analyzer: output-length upper bounds and compound-request pattern graphs."""
