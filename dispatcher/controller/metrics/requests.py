"""How long the process's own requests take: to the API server, and the webhook's answers.

Every process that talks to the API has these: `dispatcher run` in its observer's
registry, `dispatcher webhook` in a registry of its own.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from .labels import OTHER, PREFIX, bounded

# One request to the API server takes milliseconds; a slow list or an overloaded server,
# seconds (an attempt times out at 15 s). Waiting for the client's own pacing: from nothing
# to seconds when a burst of writes meets --kube-qps.
API_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0,
               30.0)
# The API server waits 10 s for the AppWrapper webhooks and 2 s for the pod webhook.
WEBHOOK_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0,
                   10.0)
VERBS = ("GET", "POST", "PUT", "PATCH", "DELETE")
PACING_PRIORITIES = ("urgent", "status", "event")  # pacing.URGENT, STATUS, EVENT
WEBHOOK_ENDPOINTS = ("mutate", "validate", "pin-pods", "convert")
WEBHOOK_RESULTS = ("allowed", "denied", "error", "bad_request")
NO_ANSWER_CODE = "none"  # a refused or cut connection, or a timeout


def _code(status: int) -> str:
    """An HTTP status as a label: its number (bounded: 100-599), or none for no answer."""
    return str(status) if 100 <= status <= 599 else NO_ANSWER_CODE


class RequestMetrics:
    """How long the process's own requests take: to the API server (each attempt, and the
    wait for the client's pacing before it), and the webhook's answers to the API server.
    Every process that talks to the API has them: `dispatcher run` in its observer's
    registry, `dispatcher webhook` in a registry of its own."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.api_duration = Histogram(
            f"{PREFIX}_api_request_duration_seconds", "One attempt of a request to the API "
            "server, from sending it to the last byte of the answer (watches excluded), by "
            "verb.", ["verb"], buckets=API_BUCKETS, registry=r)
        self.api_requests = Counter(
            f"{PREFIX}_api_requests", "Attempts of requests to the API server, by verb and "
            "HTTP status code (none: no answer, a refused or cut connection or a timeout).",
            ["verb", "code"], registry=r)
        self.pacing_wait = Histogram(
            f"{PREFIX}_api_pacing_wait_seconds", "Time a request waited for the client's "
            "own pacing (--kube-qps, --kube-burst) before it was sent, by priority: urgent "
            "(reads, Dispatched writes, creating items), status (other status writes), "
            "event.", ["priority"], buckets=API_BUCKETS, registry=r)
        self.webhook_duration = Histogram(
            f"{PREFIX}_webhook_request_duration_seconds", "Time to answer one "
            "AdmissionReview or ConversionReview, from reading it to the answer, by endpoint "
            "(mutate, validate, pin-pods, convert) and result (allowed, denied, error: the "
            "review failed, bad_request: not a review; a conversion that fails is denied).",
            ["endpoint", "result"], buckets=WEBHOOK_BUCKETS,
            registry=r)
        for verb in VERBS:
            self.api_duration.labels(verb)
        for priority in PACING_PRIORITIES:
            self.pacing_wait.labels(priority)

    def api_request(self, verb: str, status: int, seconds: float) -> None:
        verb = bounded(verb, VERBS, OTHER)
        self.api_duration.labels(verb).observe(max(0.0, seconds))
        self.api_requests.labels(verb, _code(status)).inc()

    def api_paced(self, priority: int, seconds: float) -> None:
        name = PACING_PRIORITIES[priority] if 0 <= priority < len(PACING_PRIORITIES) \
            else OTHER
        self.pacing_wait.labels(name).observe(max(0.0, seconds))

    def webhook_review(self, endpoint: str, result: str, seconds: float) -> None:
        self.webhook_duration.labels(bounded(endpoint, WEBHOOK_ENDPOINTS, OTHER),
                                     bounded(result, WEBHOOK_RESULTS, OTHER)
                                     ).observe(max(0.0, seconds))


