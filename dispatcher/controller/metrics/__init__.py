"""Prometheus metrics and the HTTP server for /metrics, /healthz and the
visibility endpoint: counters, gauges read from memory, request metrics.
"""
