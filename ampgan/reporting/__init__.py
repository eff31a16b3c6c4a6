"""Reporting: what sweeps, studies and diagnose show a person. Tables, charts and HTML pages of
runs read back from a store (`report`, `python -m ampgan.report`) and Pillow pictures (`plots`).

May import: `ampgan`, `ampgan.config`. It reads runs; it never builds a task or runs a step.
"""
