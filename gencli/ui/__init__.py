"""Terminal presentation: progress bars, tables, JSON output. Only the CLI imports this."""
