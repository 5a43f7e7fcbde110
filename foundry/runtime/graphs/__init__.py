"""Captured and restored graphs: capture helpers, the native builder and launch plans,
background instantiation, and what a restored graph replays with (philox cells,
output tensors over region memory)."""
