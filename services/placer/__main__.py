"""Entry point: `python -m services.placer`."""

from __future__ import annotations

import os

from services.placer.service import Placer
from shared.runtime import serve_process
from shared.settings import PlacerSettings


def main() -> None:
    serve_process(PlacerSettings.from_env(os.environ), Placer)


if __name__ == "__main__":
    main()
