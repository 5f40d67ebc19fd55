"""Builders and plugins the tests share (factories, workdirs, nights, servers, accounts, bench_runner, skips)."""
