"""Engine-level scheduling policies and router policies behind small Protocols, with a registry."""
