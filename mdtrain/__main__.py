"""`python -m mdtrain` is the `mdtrain` command."""

from mdtrain.cli import main

raise SystemExit(main())
