"""Shared fixtures and the hypothesis profiles.

Profiles: `ci` (derandomized, no deadline: deterministic on a noisy 2-core machine), `dev` (random,
fewer examples), `big` (deep runs: `nox -s scenarios -- --big`). HYPOTHESIS_PROFILE selects one.
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", derandomize=True, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", deadline=None, max_examples=50)
settings.register_profile(
    "big", deadline=None, max_examples=5000, suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))
