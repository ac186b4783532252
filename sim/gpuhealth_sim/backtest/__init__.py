"""Traces and backtests: record, generate or import a fleet's history, replay it through the operator.

`traces` is the trace format; `tracerecord` (`record`), `tracegen` (`trace
generate`) and `prometheus_import` (`trace import`) write traces;
`replayer` replays one through the operator's own code against the
in-memory cluster `memcluster`; `scoring` scores a replay against a
trace's ground truth and `liveactions` compares it with a live operator;
`subcommands` holds these commands of `gpu-health-sim`, `defaults` what their
--help shows (without importing the modules above).
"""
