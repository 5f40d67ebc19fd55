"""The /metrics body is valid Prometheus text exposition: HELP and TYPE per family, escaped labels, cumulative
histogram buckets ending at +Inf with _sum and _count."""

from __future__ import annotations

import re

from gencli.core.serve.metrics import ServeMetrics

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? (\S+)$')


def test_exposition_parses_and_histograms_are_cumulative():
    m = ServeMetrics()
    m.requests.inc(endpoint="/v1/recommend", status="200")
    m.requests.inc(endpoint="/v1/recommend", status="200")
    for value in (0.0004, 0.003, 0.003, 7.0, 99.0):
        m.latency.observe(value, endpoint="/v1/recommend")
    m.batch.observe(16)
    m.model.replace(1, model_id="abc", path='/srv/"odd"\\path\nx', created="")
    m.model.replace(1, model_id="def", path="/srv/b", created="2026")  # an info gauge names one bundle
    text = m.registry.render()
    families = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            families[name] = kind
        elif not line.startswith("# HELP "):
            assert SAMPLE.match(line), line
    assert families["gencli_serve_request_seconds"] == "histogram" and families["gencli_serve_requests_total"] == "counter"
    assert 'gencli_serve_requests_total{endpoint="/v1/recommend",status="200"} 2' in text
    buckets = [int(v) for v in re.findall(r'^gencli_serve_request_seconds_bucket\{endpoint="/v1/recommend",le="[^"]+"\} (\d+)$',
                                           text, re.M)]
    assert buckets == sorted(buckets) and buckets[0] == 1 and buckets[-2] == 4 and buckets[-1] == 5
    assert 'le="+Inf"} 5' in text and 'gencli_serve_request_seconds_count{endpoint="/v1/recommend"} 5' in text
    assert 'gencli_serve_batch_histories_bucket{le="16"} 1' in text and 'le="8"} 0' in text
    assert 'model_id="abc"' not in text and 'gencli_serve_model_info{created="2026",model_id="def",path="/srv/b"} 1' in text
    assert 'gencli_serve_reloads_total{result="failed"} 0' in text  # present before the first failure: alertable


def test_label_values_are_escaped():
    m = ServeMetrics()
    m.model.set(1, model_id="x", path='a"b\\c\nd', created="")
    assert 'path="a\\"b\\\\c\\nd"' in m.registry.render()
