"""GPU side of Foundry: environment capture, graph capture helpers, SAVE/LOAD sessions.

Everything here imports torch and cuda-bindings lazily, inside functions.
"""
