"""Entry point: `python -m services.admission`."""

from __future__ import annotations

import os

from services.admission.service import Admission
from shared.runtime import serve_process
from shared.settings import AdmissionSettings


def main() -> None:
    serve_process(AdmissionSettings.from_env(os.environ), Admission, pool_size=10)


if __name__ == "__main__":
    main()
