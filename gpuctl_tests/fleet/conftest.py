"""The Prometheus sites' fixtures (``prom_site``) for the folder's ``test_prom*.py``."""

from gpuctl_tests.fleet.prom_site import (  # noqa: F401 (fixtures, found by name)
    _steady,
    site,
    state_dir,
    steady_site,
    store,
    stores,
)
