"""gencli: generative recommendation with semantic IDs, as a command-line tool suite."""

__version__ = "0.1.0"
