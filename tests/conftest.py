import os

from hypothesis import HealthCheck, settings

# CI draws the same examples every run (derandomize), so a failure reproduces from the log;
# HYPOTHESIS_PROFILE=explore draws new ones, more of them, to look for failures on purpose.
settings.register_profile(
    "collio",
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
settings.register_profile(
    "explore", max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "collio"))
