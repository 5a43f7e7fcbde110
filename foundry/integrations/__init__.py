"""Serving-engine integrations: plugins that put an engine's graphs through Foundry."""
