"""The fleet router: OpenAI-compatible front door with gain-oriented dispatch."""
