"""The LLM engine: a model endpoint the user configures, held to the same gates as the deterministic engine."""
