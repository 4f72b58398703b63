"""Container health check: exit 0 if ``URL`` answers 200 within 5 s (stdlib only)."""

import sys
import urllib.request

try:
    with urllib.request.urlopen(sys.argv[1], timeout=5) as response:
        sys.exit(0 if response.status == 200 else 1)
except Exception as exc:  # noqa: BLE001 - any failure is "unhealthy"
    print(f"unhealthy: {exc}", file=sys.stderr)
    sys.exit(1)
