"""SAVE and LOAD sessions: what a program opens to persist its graphs and get them back."""
