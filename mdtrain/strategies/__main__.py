"""`python -m mdtrain.strategies NAME [--result FILE] [--smoke]`: one probe."""

import sys

from mdtrain.strategies.probes import main

if __name__ == "__main__":
    sys.exit(main())
