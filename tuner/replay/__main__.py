"""`python -m tuner.replay SPEC --role ...`: one load-generator process (see `_worker`)."""

import os
import sys

from tuner.replay._worker import main

rc = main()
sys.stdout.flush()
sys.stderr.flush()
# Leave without interpreter teardown: gRPC's threads under gevent can hang it after the work is done.
os._exit(rc)
