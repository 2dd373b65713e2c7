"""The documented OTLP-over-HTTP setup, end to end: spans reach a collector, exported off the hub.

The collector is a stdlib HTTP server on a thread of the test process (a caller from outside the
Mayfly hub); it decodes each request with the OTLP protobuf schema. The exporter
(opentelemetry-exporter-otlp-proto-http) is a test dependency, admitted without its gcp-auth extra.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from mayfly import HandlerRegistry, HandlerRequest, Node, RunStatus, Succeeded, WorkflowSpec
from mayfly.runtime import WorkflowRuntime
from mayfly.telemetry import causal_key
from mayfly.telemetry.otel import OffloadSpanExporter, instrument

CANARY = "canary-otlp-3b9a-stays-home"


class Collector(HTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Receive)
        self.bodies: list[bytes] = []


class _Receive(BaseHTTPRequestHandler):
    server: Collector

    def do_POST(self) -> None:
        assert self.path == "/v1/traces"
        length = int(self.headers["Content-Length"])
        self.server.bodies.append(self.rfile.read(length))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return None


@pytest.fixture
def collector() -> Iterator[Collector]:
    server = Collector()
    thread = threading.Thread(target=server.serve_forever, name="otlp collector", daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(10)


def test_spans_reach_an_otlp_collector_over_http(tmp_path: Path, collector: Collector) -> None:
    """Run, attempt and commit spans arrive as OTLP protobuf, in the run's causal-key trace, with no payload."""
    handlers = HandlerRegistry()

    @handlers.handler("echo")
    def echo(request: HandlerRequest) -> Succeeded:
        return Succeeded(output={"echo": CANARY})

    port = collector.server_address[1]
    exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces", timeout=10)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(OffloadSpanExporter(exporter, timeout_s=20)))  # type: ignore[arg-type]
    try:
        runtime = WorkflowRuntime(f"file://{tmp_path}/journal", handlers)
        instrument(runtime, provider.get_tracer("mayfly"))
        spec = WorkflowSpec(workflow_id="otlp.flow", version=1, nodes=(Node("echo", handler="echo@1"),))
        result = runtime.execute(spec, {"secret": CANARY})
        assert result.status is RunStatus.SUCCEEDED
    finally:
        provider.shutdown()
    assert collector.bodies, "no OTLP request reached the collector"
    names = []
    trace_ids = set()
    for body in collector.bodies:
        assert CANARY.encode() not in body
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                assert scope_spans.scope.name == "mayfly"
                for span in scope_spans.spans:
                    names.append(span.name)
                    trace_ids.add(span.trace_id.hex())
    assert names.count("mayfly.run") == 1
    assert names.count("mayfly.attempt") == 1
    assert names.count("mayfly.commit") >= 2
    assert trace_ids == {causal_key(result.run_id)}
