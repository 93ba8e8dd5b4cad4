#!/usr/bin/env bash
# Installs, builds and runs a local demo job: 4 ranks on this machine, each printing
# the assignment caf-hvd gave it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build >/dev/null
exec build/apps/caf-hvd run -np 4 -- sh -c \
  'echo "rank $HOROVOD_RANK/$HOROVOD_SIZE on $HOROVOD_HOSTNAME:" \
        "local $HOROVOD_LOCAL_RANK/$HOROVOD_LOCAL_SIZE," \
        "cross $HOROVOD_CROSS_RANK/$HOROVOD_CROSS_SIZE," \
        "iface $HOROVOD_GLOO_IFACE, master $MASTER_ADDR:$MASTER_PORT"'
