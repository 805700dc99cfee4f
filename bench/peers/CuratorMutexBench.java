// Apache Curator's InterProcessMutex on dlock's workloads (docs/performance.md):
//   java -cp <curator+zookeeper jars>:. CuratorMutexBench CONNECT WORKLOAD SECONDS LOGDIR [CLIENTS]
// WORKLOAD: uncontended (1 client, its own path) or contended (CLIENTS, default
// 8, on one path: acquire, hold 1 ms, release, think 1 ms). Each client is a
// thread with its own CuratorFramework, so its own ZooKeeper session, as a
// separate process would have. Writes grant logs (System.nanoTime is
// CLOCK_MONOTONIC on Linux) and per-client CPU for bench/peers/stats.py.
import java.io.FileWriter;
import java.io.IOException;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.ExponentialBackoffRetry;

public class CuratorMutexBench {
    public static void main(String[] args) throws Exception {
        String connect = args[0];
        boolean contended = args[1].equals("contended");
        double seconds = Double.parseDouble(args[2]);
        String logdir = args[3];
        int clients = args.length > 4 ? Integer.parseInt(args[4]) : (contended ? 8 : 1);
        new java.io.File(logdir).mkdirs();
        CountDownLatch ready = new CountDownLatch(clients);
        long[] window = new long[2];
        CountDownLatch go = new CountDownLatch(1);
        String base = "/curator-bench/" + ProcessHandle.current().pid();
        ThreadMXBean mx = ManagementFactory.getThreadMXBean();
        Thread[] ts = new Thread[clients];
        int[] failed = new int[1];
        for (int i = 0; i < clients; i++) {
            final int id = i;
            ts[i] = new Thread(() -> {
                try (CuratorFramework c = CuratorFrameworkFactory.newClient(connect, 30000, 10000,
                        new ExponentialBackoffRetry(100, 3))) {
                    c.start();
                    c.blockUntilConnected();
                    // JIT warm-up on a path of its own: contention belongs to the window.
                    InterProcessMutex warm = new InterProcessMutex(c, base + "-warm-" + id);
                    for (int w = 0; w < 200; w++) {
                        warm.acquire();
                        warm.release();
                    }
                    InterProcessMutex m = new InterProcessMutex(c, contended ? base : base + "-" + id);
                    ready.countDown();
                    go.await();
                    while (System.nanoTime() < window[0])
                        Thread.sleep(0, 100000);
                    // Curator's own threads (event, heartbeat) are not counted: per-thread CPU only.
                    long cpu0 = mx.getCurrentThreadCpuTime();
                    StringBuilder sb = new StringBuilder();
                    for (;;) {
                        long req = System.nanoTime();
                        if (req >= window[1])
                            break;
                        if (!m.acquire(60, TimeUnit.SECONDS))
                            throw new IllegalStateException("not acquired in 60 s");
                        long got = System.nanoTime();
                        if (contended)
                            Thread.sleep(1);
                        long rel0 = System.nanoTime();
                        m.release();
                        sb.append(req).append(' ').append(got).append(' ').append(rel0).append(' ')
                                .append(System.nanoTime()).append('\n');
                        if (contended)
                            Thread.sleep(1);
                    }
                    long cpu = mx.getCurrentThreadCpuTime() - cpu0;
                    try (FileWriter f = new FileWriter(logdir + "/client-" + id + ".log")) {
                        f.write(sb.toString());
                    }
                    try (FileWriter f = new FileWriter(logdir + "/cpu-" + id)) {
                        f.write(String.format("%.6f", cpu / 1e9));
                    }
                } catch (Exception e) {
                    e.printStackTrace();
                    synchronized (failed) {
                        failed[0] = 1;
                    }
                    ready.countDown();
                }
            });
            ts[i].start();
        }
        ready.await();
        window[0] = System.nanoTime() + 20_000_000L;
        window[1] = window[0] + (long) (seconds * 1e9);
        go.countDown();
        for (Thread t : ts)
            t.join();
        if (failed[0] != 0)
            System.exit(1);
        try (FileWriter f = new FileWriter(logdir + "/window")) {
            f.write(window[0] + " " + window[1] + "\n");
        }
    }
}
