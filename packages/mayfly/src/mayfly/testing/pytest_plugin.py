"""Pytest fixtures for testing workflows (registered as the ``mayfly`` pytest11 plugin).

Installed with ``mayfly-runtime``; nothing is imported from Mayfly until a fixture is used.
"""
