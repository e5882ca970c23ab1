"""`python -m mdtrain.ps serve | chief <args>`: what each task of a parameter-server job runs."""

from mdtrain.ps import main

raise SystemExit(main())
