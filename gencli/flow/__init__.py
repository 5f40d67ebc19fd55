"""Workflows over a workdir, between the CLI and the core: a pipeline run, retraining and promotion, export, queries.

Each is an importable function that takes configs and paths and returns plain results; the CLI parses options,
calls one of them and prints what it returns. Steps themselves run through :mod:`gencli.workspace.executor`.
"""
