"""Entry point of the cluster-side health monitor: `python -m services.health`."""

from __future__ import annotations

import os

from services.health.monitor import Monitor
from shared.runtime import serve_process
from shared.settings import HealthSettings


def main() -> None:
    serve_process(HealthSettings.from_env(os.environ), Monitor)


if __name__ == "__main__":
    main()
