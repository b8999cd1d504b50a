"""A predictor that answers at once (the child's protocol: the request as JSON on stdin, one
JSON line per target on stdout), for tests that exercise the API around predictions rather
than the predictions: ``tests/backend/api/test_schemathesis.py`` sends hundreds of them."""

import json
import sys

if __name__ == "__main__":
    request = json.load(sys.stdin)
    for target in request.get("targets") or [request["target"]]:
        summary = {
            "peak_allocated_bytes": 1,
            "prediction": {"target": target, "method": "instant (a test's)", "error_bound": "none"},
        }
        print(json.dumps({"target": target, "status": "succeeded", "summary": summary}), flush=True)
