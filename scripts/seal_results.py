"""Check, add or accept the manifests of results files (see harness/store/sealing.py).

    python scripts/seal_results.py --check results
    python scripts/seal_results.py --committed results tests/harness/fixtures
    python scripts/seal_results.py --accept results/sm90/<run>
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from harness.store.sealing import main

if __name__ == "__main__":
    raise SystemExit(main())
