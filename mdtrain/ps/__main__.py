"""`python -m mdtrain.ps serve` (a ps or worker task) or `... chief <train arguments>`."""

import sys

from mdtrain.ps.processes import main

if __name__ == "__main__":
    sys.exit(main())
