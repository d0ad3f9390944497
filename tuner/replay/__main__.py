"""`python -m tuner.replay SPEC --role ...`: one load-generator process (see `_worker`);
`python -m tuner.replay --serve FD`: the fork server that starts them (see `_serve`, `_forkserver`)."""

import os
import sys

if sys.argv[1:2] == ["--serve"]:
    from tuner.replay._serve import serve

    rc = serve(int(sys.argv[2]))
else:
    from tuner.replay._worker import main

    rc = main()
sys.stdout.flush()
sys.stderr.flush()
# Leave without interpreter teardown: gRPC's threads under gevent can hang it after the work is done.
os._exit(rc)
