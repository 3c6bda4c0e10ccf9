"""`python -m sia_grpc.cli`: the `sia` command."""

import sys

from sia_grpc.cli import main

sys.exit(main())
