"""Scale-out: the throughput workload with 1, 2 and 4 ``geneva-drive worker`` processes.

    .venv/bin/python benchmarks/scaleout.py --workflows 2000

The same as ``throughput.py --processes 1,2,4`` (same flags). On a 2-core machine the
database, the workers and this script share two cores, so more processes cannot add CPU:
read the result as "does the claim path scale without contention", not as capacity.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import throughput

if __name__ == "__main__":
    throughput.main(["--processes", "1,2,4", *sys.argv[1:]])
