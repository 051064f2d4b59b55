"""How the fuzz tests run: the same cases on every run (CI is reproducible), no example
database, no deadline per case (a shared CI machine is slow at times), and the count of
cases the issue asks for per endpoint."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

CASES = int(os.environ.get("BERTH_FUZZ_CASES", "2000"))
"""Cases per endpoint: 2,000 in `make test` and CI; `BERTH_FUZZ_CASES` sets fewer for a
quick run while working on a finding."""

FUZZ = settings(
    max_examples=CASES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
