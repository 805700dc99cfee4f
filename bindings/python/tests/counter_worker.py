"""One process of test_mutual_exclusion: ROUNDS times, under the lock, read
the counter file ("count fence"), check that the fence grew, and write
count + 1 with our fence, with a pause between the read and the write that
lets an unprotected writer lose an update."""
import sys
import time

import dlock

uri, name, path, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
with dlock.Store(uri) as store:
    lock = store.lock(name, ttl=10, wait=60)
    for _ in range(rounds):
        with lock:
            with open(path) as f:
                count, fence = (int(x) for x in f.read().split())
            if lock.fence <= fence:
                sys.exit("fence %d not above the last writer's %d" % (lock.fence, fence))
            time.sleep(0.002)
            with open(path, "w") as f:
                f.write("%d %d" % (count + 1, lock.fence))
