"""`python -m mdtrain.ps serve`: what the ps and worker tasks of a parameter-server job run."""

from mdtrain.ps import main

raise SystemExit(main())
