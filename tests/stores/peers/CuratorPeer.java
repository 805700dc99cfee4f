// The Curator side of tests/stores/zookeeper_curator.sh: Apache Curator's own
// lock recipes on a lock path that dlock (zk://...?recipe=curator[-rw]) uses
// too.
//   CuratorPeer CONNECT PATH count mutex|write N FILE
//       N times: take the lock, read the number in FILE, write it + 1
//       (with a pause between the read and the write, so that two writers
//       without exclusion lose updates), release.
//   CuratorPeer CONNECT PATH hold mutex|write|read
//       take the lock, print "held" and keep it until killed.
//   CuratorPeer CONNECT PATH holduntil mutex FILE
//       take the lock, print "held", keep it until FILE exists, release.
//   CuratorPeer CONNECT PATH try mutex|write|read WAIT_MS
//       exit 0 when the lock is taken within WAIT_MS (then released), 3 if not.
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.concurrent.TimeUnit;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessLock;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.retry.RetryNTimes;

public class CuratorPeer {
    static InterProcessLock lock(CuratorFramework c, String path, String kind) {
        switch (kind) {
            case "mutex": return new InterProcessMutex(c, path);
            case "write": return new InterProcessReadWriteLock(c, path).writeLock();
            case "read": return new InterProcessReadWriteLock(c, path).readLock();
            default: throw new IllegalArgumentException(kind);
        }
    }

    public static void main(String[] a) throws Exception {
        CuratorFramework c = CuratorFrameworkFactory.builder().connectString(a[0])
            .sessionTimeoutMs(4000).connectionTimeoutMs(4000).retryPolicy(new RetryNTimes(50, 100)).build();
        c.start();
        if (!c.blockUntilConnected(20, TimeUnit.SECONDS))
            throw new IllegalStateException("no connection to " + a[0]);
        InterProcessLock l = lock(c, a[1], a[3]);
        switch (a[2]) {
            case "count": {
                int n = Integer.parseInt(a[4]);
                Path f = Paths.get(a[5]);
                for (int i = 0; i < n; i++) {
                    if (!l.acquire(60, TimeUnit.SECONDS))
                        throw new IllegalStateException("not acquired in 60 s");
                    long v = Long.parseLong(new String(Files.readAllBytes(f), StandardCharsets.US_ASCII).trim());
                    Thread.sleep(3);
                    Files.write(f, (Long.toString(v + 1) + "\n").getBytes(StandardCharsets.US_ASCII));
                    l.release();
                }
                break;
            }
            case "hold":
                l.acquire();
                System.out.println("held");
                System.out.flush();
                Thread.sleep(Long.MAX_VALUE);
                break;
            case "holduntil": {
                l.acquire();
                System.out.println("held");
                System.out.flush();
                Path f = Paths.get(a[4]);
                while (!Files.exists(f))
                    Thread.sleep(20);
                l.release();
                break;
            }
            case "try":
                if (!l.acquire(Long.parseLong(a[4]), TimeUnit.MILLISECONDS)) {
                    c.close();
                    System.exit(3);
                }
                l.release();
                break;
            default:
                throw new IllegalArgumentException(a[2]);
        }
        c.close();
    }
}
